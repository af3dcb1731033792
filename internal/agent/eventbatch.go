package agent

import (
	"net/netip"
	"sync"
	"time"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/policy"
)

// eventBatchEvery is how often batched verdict events become flow records.
const eventBatchEvery = time.Second

// eventKey is a verdict event without its time and source port: the
// events one flow record aggregates (the flow store's key, before names).
type eventKey struct {
	ifindex int
	dir     policy.Direction
	verdict policy.Verdict
	stage   policy.Stage
	rule    policy.RuleID
	log     policy.RuleID
	passed  policy.RuleID
	peer    policy.Identity
	src     netip.Addr
	dst     netip.AddrPort
	proto   uint8
}

// eventAgg is the events of one key since the last drain.
type eventAgg struct {
	first datapath.VerdictEvent // names and time of the record
	count uint64
	last  time.Time
}

// eventBatch counts verdict events by key between drains. A burst of new
// connections between two pods is one map entry, explained once per
// drain instead of once per connection: naming a flow (rule names,
// addresses as text) costs more than the datapath spends on it.
type eventBatch struct {
	mu      sync.Mutex
	pending map[eventKey]*eventAgg
}

func newEventBatch() *eventBatch { return &eventBatch{pending: map[eventKey]*eventAgg{}} }

func keyOfEvent(ev datapath.VerdictEvent) eventKey {
	return eventKey{ifindex: ev.Ifindex, dir: ev.Direction, verdict: ev.Verdict, stage: ev.Stage,
		rule: ev.Rule, log: ev.Log, passed: ev.Passed, peer: ev.Peer,
		src: ev.Src.Addr(), dst: ev.Dst, proto: ev.Proto}
}

// add counts one event.
func (b *eventBatch) add(ev datapath.VerdictEvent) {
	k := keyOfEvent(ev)
	b.mu.Lock()
	defer b.mu.Unlock()
	if agg, ok := b.pending[k]; ok {
		agg.count++
		if ev.Time.After(agg.last) {
			agg.last = ev.Time
		}
		return
	}
	b.pending[k] = &eventAgg{first: ev, count: 1, last: ev.Time}
}

// drain returns what was counted since the last drain and starts anew.
func (b *eventBatch) drain() []eventAgg {
	b.mu.Lock()
	pending := b.pending
	b.pending = make(map[eventKey]*eventAgg, len(pending))
	b.mu.Unlock()
	out := make([]eventAgg, 0, len(pending))
	for _, agg := range pending {
		out = append(out, *agg)
	}
	return out
}

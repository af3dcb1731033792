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
	service netip.AddrPort
	byCli   bool
}

// eventAgg is the events of one key since the last drain.
type eventAgg struct {
	first datapath.VerdictEvent // names and time of the record
	count uint64
	last  time.Time
	// ports, peers: how many destination ports (of one address), or
	// destinations, this record folds; zero when it folds none.
	ports, peers int
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
		src: ev.Src.Addr(), dst: ev.Dst, proto: ev.Proto, service: ev.Service, byCli: ev.ServiceByClient}
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
	return foldScans(out)
}

// A scan must not rotate a node's flow history out: within one batch,
// the denied flows of one source towards more ports of one address than
// foldPortsAbove become one record (dst without port, ports folded), and
// a source's denied records towards more destinations than
// foldPeersAbove become one (no dst, peers folded). Allowed flows are
// never folded: each is a connection someone may need to find.
const (
	foldPortsAbove = 8
	foldPeersAbove = 16
)

// foldScans folds the denied records of scans, ports first.
func foldScans(aggs []eventAgg) []eventAgg {
	aggs = foldBy(aggs, foldPortsAbove, func(k eventKey) eventKey {
		k.dst = netip.AddrPortFrom(k.dst.Addr(), 0)
		return k
	}, func(a *eventAgg, n int) { a.ports = n })
	return foldBy(aggs, foldPeersAbove, func(k eventKey) eventKey {
		k.dst, k.peer = netip.AddrPort{}, 0
		return k
	}, func(a *eventAgg, n int) { a.peers = n })
}

// foldBy merges the denied records whose keys coarse makes equal, where
// more than above of them share one, into one record of their summed
// count; mark records how many it merged.
func foldBy(aggs []eventAgg, above int, coarse func(eventKey) eventKey, mark func(*eventAgg, int)) []eventAgg {
	groups := map[eventKey][]int{}
	for i, a := range aggs {
		if v := a.first.Verdict; v == policy.VerdictDeny || v == policy.VerdictReject {
			k := coarse(keyOfEvent(a.first))
			groups[k] = append(groups[k], i)
		}
	}
	folded := make([]bool, len(aggs))
	var out []eventAgg
	for k, idx := range groups {
		if len(idx) <= above {
			continue
		}
		merged := aggs[idx[0]]
		merged.count, merged.ports, merged.peers = 0, 0, 0
		for _, i := range idx {
			a := aggs[i]
			folded[i] = true
			merged.count += a.count
			if a.first.Time.Before(merged.first.Time) {
				merged.first = a.first
			}
			if a.last.After(merged.last) {
				merged.last = a.last
			}
		}
		merged.first.Dst, merged.first.Peer = k.dst, k.peer
		mark(&merged, len(idx))
		out = append(out, merged)
	}
	for i, a := range aggs {
		if !folded[i] {
			out = append(out, a)
		}
	}
	return out
}

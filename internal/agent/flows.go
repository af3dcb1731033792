package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/policy"
)

// flowLogSize is how many recent flows an agent keeps in memory.
const flowLogSize = 4096

// followerBuffer is how far a follower may fall behind before it misses
// flows; a slow reader never holds the datapath's reader up.
const followerBuffer = 1024

// flowLog keeps a node's recent flows and hands new ones to followers.
type flowLog struct {
	mu        sync.Mutex
	ring      []api.Flow
	next      int
	followers map[chan api.Flow]struct{}
	missed    atomic.Uint64 // flows a follower was too slow for
}

func newFlowLog() *flowLog {
	return &flowLog{ring: make([]api.Flow, 0, flowLogSize), followers: map[chan api.Flow]struct{}{}}
}

func (l *flowLog) add(f api.Flow) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.ring) < cap(l.ring) {
		l.ring = append(l.ring, f)
	} else {
		l.ring[l.next] = f
		l.next = (l.next + 1) % len(l.ring)
	}
	for ch := range l.followers {
		select {
		case ch <- f:
		default:
			l.missed.Add(1)
		}
	}
}

// recent returns the flows held, oldest first.
func (l *flowLog) recent() []api.Flow {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]api.Flow, 0, len(l.ring))
	out = append(out, l.ring[l.next:]...)
	return append(out, l.ring[:l.next]...)
}

// follow returns the flows held and a channel of every later one, in one
// step so none falls between them; cancel ends the subscription.
func (l *flowLog) follow() ([]api.Flow, <-chan api.Flow, func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch := make(chan api.Flow, followerBuffer)
	l.followers[ch] = struct{}{}
	held := make([]api.Flow, 0, len(l.ring))
	held = append(append(held, l.ring[l.next:]...), l.ring[:l.next]...)
	return held, ch, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.followers, ch)
	}
}

// flowNames are the names a verdict event is explained with, rebuilt after
// every policy load.
type flowNames struct {
	pods   map[int]string                   // host ifindex -> namespace/name
	byIP   map[netip.Addr]string            // cluster pods and nodes
	labels map[policy.Identity][]string     // identity -> its labels
	rules  map[policy.RuleID]policy.RuleRef // from the compiled result
}

func newFlowNames(s k8s.Snapshot, eps map[string]datapath.PolicyEndpoint, res *policy.Result) *flowNames {
	n := &flowNames{pods: map[int]string{}, byIP: map[netip.Addr]string{}, labels: map[policy.Identity][]string{}, rules: res.Rules}
	for pod, ep := range eps {
		n.pods[ep.Ifindex] = pod
	}
	for _, nd := range s.Nodes {
		if nd.InternalIP.IsValid() {
			n.byIP[nd.InternalIP] = "node/" + nd.Name
		}
	}
	for _, p := range s.ClusterPods {
		if p.HostNetwork || p.Terminal {
			continue
		}
		for _, ip := range p.IPs {
			n.byIP[ip] = p.Key()
		}
	}
	for _, id := range s.IdentityObjects {
		n.labels[id.ID] = id.Labels
	}
	return n
}

// explain turns a datapath event into a flow record.
func (n *flowNames) explain(node string, ev datapath.VerdictEvent) api.Flow {
	f := api.Flow{
		Time: ev.Time, Node: node, Direction: ev.Direction.String(),
		Src: ev.Src.String(), Dst: ev.Dst.String(), Proto: protoName(ev.Proto),
		PeerIdentity: uint32(ev.Peer), Pod: fmt.Sprintf("ifindex %d", ev.Ifindex),
	}
	peer := ev.Src.Addr()
	if ev.Direction == policy.Egress {
		peer = ev.Dst.Addr()
	}
	f.Peer = peer.String()
	if n != nil {
		if pod, ok := n.pods[ev.Ifindex]; ok {
			f.Pod = pod
		}
		if name, ok := n.byIP[peer]; ok {
			f.Peer = name
		}
		f.PeerLabels = n.labels[ev.Peer]
	}
	switch ev.Verdict {
	case datapath.VerdictAllowed:
		f.Verdict = "allowed"
		f.Rule = "no policy selects the pod for " + f.Direction
		if ev.Rule != 0 {
			f.Rule = ruleName(n, ev.Rule)
		}
	case datapath.VerdictDenied:
		f.Verdict = "denied"
		f.Rule = "default deny: policies select the pod for " + f.Direction + " and no rule allows this peer and port"
	default:
		f.Verdict = "verdict " + strconv.Itoa(int(ev.Verdict))
	}
	return f
}

func ruleName(n *flowNames, id policy.RuleID) string {
	if n != nil {
		if ref, ok := n.rules[id]; ok {
			return ref.String()
		}
	}
	if id == policy.RuleNodeTraffic {
		return policy.RuleRef{}.String()
	}
	return fmt.Sprintf("rule %d (no longer loaded)", id)
}

func protoName(p uint8) string {
	switch p {
	case 6:
		return "TCP"
	case 17:
		return "UDP"
	case 132:
		return "SCTP"
	case 1:
		return "ICMP"
	}
	return strconv.Itoa(int(p))
}

// readFlows turns the datapath's verdict events into flows until ctx ends.
func (a *Agent) readFlows(ctx context.Context, node *datapath.Node) error {
	rd, err := node.OpenEventReader()
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		rd.Close()
	}()
	go func() {
		for {
			ev, err := rd.Read()
			if errors.Is(err, datapath.ErrEventsClosed) {
				return
			}
			if err != nil {
				a.log.Warn("verdict event", "err", err)
				continue
			}
			a.flows.add(a.flowNames.Load().explain(a.cfg.NodeName, ev))
		}
	}()
	return nil
}

// serveFlows answers GET /v1/flows: the flows held, as JSON lines, and
// with ?follow=1 every new one until the client goes away.
func (a *Agent) serveFlows(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := newLineEncoder(w)
	if r.URL.Query().Get("follow") == "" {
		for _, f := range a.flows.recent() {
			if enc.encode(f) != nil {
				return
			}
		}
		return
	}
	held, ch, cancel := a.flows.follow()
	defer cancel()
	for _, f := range held {
		if enc.encode(f) != nil {
			return
		}
	}
	enc.flush()
	for {
		select {
		case <-r.Context().Done():
			return
		case f := <-ch:
			if enc.encode(f) != nil {
				return
			}
			enc.flush()
		}
	}
}

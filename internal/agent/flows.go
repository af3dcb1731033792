package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/flowstore"
	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/policy"
)

// flowHistory is how many of the newest records a request for a node's
// flows gets (before any followed ones); the store holds far more.
const flowHistory = 4096

// followerBuffer is how far a follower may fall behind before it misses
// flows; a slow reader never holds the datapath's reader up.
const followerBuffer = 1024

// flowLog keeps a node's flows, aggregated, in its store on disk and
// hands each new one to followers as it happens.
type flowLog struct {
	store     *flowstore.Store
	mu        sync.Mutex
	followers map[chan api.Flow]struct{}
	following atomic.Int32  // len(followers), read without the lock
	missed    atomic.Uint64 // flows a follower was too slow for
	// batch holds the datapath's events until the next drain names
	// them; drained (a recordBatch) every eventBatchEvery and on close.
	batch       *eventBatch
	recordBatch func()
}

func newFlowLog(store *flowstore.Store) *flowLog {
	return &flowLog{store: store, followers: map[chan api.Flow]struct{}{}, batch: newEventBatch()}
}

// openFlowLog opens the node's flow store: cfg.FlowDir, or the flows
// directory of cfg.StateDir, which survives a restart of the agent.
func openFlowLog(cfg Config, log *slog.Logger) (*flowLog, error) {
	dir := cfg.FlowDir
	if dir == "" {
		dir = filepath.Join(cfg.StateDir, "flows")
	}
	store, err := flowstore.Open(dir, flowstore.Options{
		MaxBytes: cfg.FlowMaxBytes,
		OnError:  func(err error) { log.Warn("flows lost", "err", err) },
	})
	if err != nil {
		return nil, err
	}
	return newFlowLog(store), nil
}

// close writes the flows held in memory to the store and closes it.
// close records the batched events and closes the store.
func (l *flowLog) close() error {
	l.mu.Lock()
	record := l.recordBatch
	l.mu.Unlock()
	if record != nil {
		record()
	}
	return l.store.Close()
}

// record stores a flow record (of Count flows, or one). Followers got
// its events one by one as they came (send).
func (l *flowLog) record(f api.Flow) { l.store.Add(f) }

// send hands f to every follower that keeps up.
func (l *flowLog) send(f api.Flow) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for ch := range l.followers {
		select {
		case ch <- f:
		default:
			l.missed.Add(1)
		}
	}
}

// recent returns the newest records, oldest first.
func (l *flowLog) recent() ([]api.Flow, error) {
	return l.query(api.FlowsQuery{Limit: flowHistory})
}

// query runs q against the whole store: the newest q.PageSize() records
// that match, oldest first.
func (l *flowLog) query(q api.FlowsQuery) ([]api.Flow, error) {
	return l.store.Query(flowstore.Query{Since: q.Since, Until: q.Before, Match: q.Matcher(), Limit: q.PageSize()})
}

// follow returns the newest records and a channel of every later flow;
// cancel ends the subscription. It subscribes, then records the batched
// events, then reads the store, so no flow falls between the two, though
// one added meanwhile may be in both: counted in a record and sent on its
// own.
func (l *flowLog) follow(q api.FlowsQuery) ([]api.Flow, <-chan api.Flow, func(), error) {
	ch := make(chan api.Flow, followerBuffer)
	l.mu.Lock()
	l.followers[ch] = struct{}{}
	l.following.Store(int32(len(l.followers)))
	record := l.recordBatch
	l.mu.Unlock()
	cancel := func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.followers, ch)
		l.following.Store(int32(len(l.followers)))
	}
	if record != nil {
		record()
	}
	held, err := l.query(q)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return held, ch, cancel, nil
}

// addCounters adds the flow store's sizes and counters to a status's.
func (l *flowLog) addCounters(counters map[string]uint64) {
	st := l.store.Stats()
	counters["flows_stored_bytes"] = uint64(st.Bytes)
	counters["flows_written"] = st.Flows
	counters["flows_dropped_segments"] = st.DroppedSegments
	counters["flows_torn_lines"] = st.TornLines
	counters["flows_write_errors"] = st.WriteErrors
	counters["flows_missed_by_followers"] = l.missed.Load()
}

// flowNames are the names a verdict event is explained with, rebuilt after
// every policy load.
type flowNames struct {
	pods   map[int]string                   // host ifindex -> namespace/name
	byIP   map[netip.Addr]string            // cluster pods and nodes
	nodeOf map[netip.Addr]string            // cluster pods' addresses -> their node
	labels map[policy.Identity][]string     // identity -> its labels
	rules  map[policy.RuleID]policy.RuleRef // from the compiled result
	// httpSets and httpRules name the HTTP rules request records cite.
	httpSets  map[policy.HTTPSetID][]policy.HTTPRuleRef
	httpRules map[policy.HTTPRuleRef]l7.Rule
	// policy is the result loaded with them: the node's proxy judges
	// the requests of flows with conditional cluster rules against it,
	// and records name what decided them from it.
	policy *policy.Result
}

func newFlowNames(s k8s.Snapshot, eps map[string]datapath.PolicyEndpoint, res *policy.Result) *flowNames {
	n := &flowNames{pods: map[int]string{}, byIP: map[netip.Addr]string{}, nodeOf: map[netip.Addr]string{},
		labels: map[policy.Identity][]string{}, rules: res.Rules, httpSets: res.HTTPSets, httpRules: res.HTTPRules,
		policy: res}
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
			n.nodeOf[ip] = p.NodeName
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
	if ev.Service.IsValid() {
		f.ServiceAddr, f.ServiceByClient = ev.Service.String(), ev.ServiceByClient
	}
	if n != nil {
		if pod, ok := n.pods[ev.Ifindex]; ok {
			f.Pod = pod
		}
		if name, ok := n.byIP[peer]; ok {
			f.Peer = name
		}
		f.PeerLabels = n.labels[ev.Peer]
	}
	f.Verdict = ev.Verdict.String()
	if ev.Verdict == policy.VerdictForwarded {
		n.explainForward(&f, ev)
		return f
	}
	f.Stage = ev.Stage.String()
	f.Rule = n.why(ev, f.Direction)
	f.Decider = n.flowRule(ev.Rule)
	f.LoggedBy = n.flowRule(ev.Log)
	f.PassedBy = n.flowRule(ev.Passed)
	return f
}

// explainForward names a flow from outside that this node translated to
// a Service's backend on another node (bpf/lib/nodeport.h): no policy
// judged it here, so the record names the backend (its Pod, though not
// local) and the node whose policy judges it.
func (n *flowNames) explainForward(f *api.Flow, ev datapath.VerdictEvent) {
	f.Pod = ev.Dst.Addr().String()
	to := "a backend that is no pod of the cluster (an address its EndpointSlice names)"
	if n != nil {
		name, known := n.byIP[ev.Dst.Addr()]
		switch node := n.nodeOf[ev.Dst.Addr()]; {
		case known && node != "":
			f.Pod, to = name, "node "+node+", whose policy judges it"
		case known:
			f.Pod, to = name, name+" (a hostNetwork backend), which judges no pod policy"
		}
	}
	f.Rule = "translated here from outside the cluster and forwarded to " + to +
		" (it sees this node's address as the source)"
}

// explainCount names a verdict counter as explain names an event: the
// fields the metrics label by.
func (n *flowNames) explainCount(c datapath.VerdictCount) api.Flow {
	f := api.Flow{Verdict: c.Verdict.String(), Direction: c.Direction.String(), Stage: c.Stage.String(),
		Pod: fmt.Sprintf("ifindex %d", c.Ifindex)}
	if n != nil {
		if pod, ok := n.pods[c.Ifindex]; ok {
			f.Pod = pod
		}
	}
	f.Decider = n.flowRule(c.Rule)
	f.LoggedBy = n.flowRule(c.Log)
	return f
}

// why says in words what decided a verdict.
func (n *flowNames) why(ev datapath.VerdictEvent, dir string) string {
	switch ev.Stage {
	case policy.StageUnenforced:
		return "no policy selects the pod for " + dir
	case policy.StageNetworkPolicyDefaultDeny:
		return "default deny: network policies select the pod for " + dir + " and no rule allows this peer and port"
	case policy.StageClosed:
		return "closed: the last policy load for the pod failed; everything is denied until one succeeds"
	case policy.StageUnidentified:
		return "unidentified peer: a pod address whose identity has not reached this node yet, denied while policy selects the pod for " + dir
	case policy.StageDefault:
		if ev.Passed != 0 {
			return "passed by " + ruleName(n, ev.Passed) + "; no later rule decided: allowed"
		}
		return "cluster policies select the pod for " + dir + " and none matches: allowed"
	}
	return ruleName(n, ev.Rule)
}

// flowRule names a rule for a flow record, nil for none.
func (n *flowNames) flowRule(id policy.RuleID) *api.FlowRule {
	if id == 0 || n == nil {
		return nil
	}
	ref, ok := n.rules[id]
	if !ok || ref.Name == "" {
		return nil
	}
	out := &api.FlowRule{Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name,
		Direction: ref.Direction.String(), Index: ref.Index, RuleName: ref.RuleName}
	if ref.Cluster() {
		out.Tier, out.Priority, out.Action = ref.Tier.String(), ref.Priority, ref.Action.String()
	}
	return out
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
	if err := a.readHTTPFlows(ctx, node); err != nil {
		rd.Close()
		return err
	}
	a.flows.mu.Lock()
	a.flows.recordBatch = a.recordEventBatch
	a.flows.mu.Unlock()
	go func() {
		t := time.NewTicker(eventBatchEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				a.recordEventBatch()
				return
			case <-t.C:
				a.recordEventBatch()
			}
		}
	}()
	go readUntilClosed(ctx, a.log, "verdict event", rd.Read, rd.Close, func(ev datapath.VerdictEvent) {
		a.flows.batch.add(ev)
		if a.flows.following.Load() > 0 {
			// Followers see every event as it happens.
			a.flows.send(a.explainFlow(a.flowNames.Load(), ev))
		}
	})
	return nil
}

// readUntilClosed hands each record read to handle until ctx ends, when
// it closes the reader; a record that cannot be read is logged and
// passed over.
func readUntilClosed[E any](ctx context.Context, log *slog.Logger, what string, read func() (E, error), closeFn func() error, handle func(E)) {
	go func() {
		<-ctx.Done()
		closeFn()
	}()
	for {
		ev, err := read()
		if errors.Is(err, datapath.ErrEventsClosed) {
			return
		}
		if err != nil {
			log.Warn(what, "err", err)
			continue
		}
		handle(ev)
	}
}

// explainFlow turns a datapath event into a flow record, naming the
// Service the client named too.
func (a *Agent) explainFlow(names *flowNames, ev datapath.VerdictEvent) api.Flow {
	f := names.explain(a.cfg.NodeName, ev)
	if ev.Service.IsValid() {
		f.Service = a.serviceNames.name(ev.Service, ev.Proto)
	}
	return f
}

// recordEventBatch names the batched events, one record per key with its
// count, counts them in the metrics and stores them.
func (a *Agent) recordEventBatch() {
	a.recordMu.Lock()
	defer a.recordMu.Unlock()
	names := a.flowNames.Load()
	for _, agg := range a.flows.batch.drain() {
		f := a.explainFlow(names, agg.first)
		f.Count, f.LastTime = agg.count, agg.last
		switch {
		case agg.peers > 0:
			f.Dst, f.Peer, f.PeerIdentity, f.PeerLabels, f.PeersFolded = "", "", 0, nil, agg.peers
		case agg.ports > 0:
			f.Dst, f.PortsFolded = agg.first.Dst.Addr().String(), agg.ports
		}
		a.flows.record(f)
	}
}

// serveFlows answers GET /v1/flows: the newest records of the flow store,
// as JSON lines, and with ?follow=1 every new flow, one by one, until the
// client goes away.
func (a *Agent) serveFlows(w http.ResponseWriter, r *http.Request) {
	var (
		held []api.Flow
		ch   <-chan api.Flow // nil unless following
		err  error
	)
	q, err := api.ParseFlowsQuery(r.URL.Query())
	if err != nil {
		writeError(w, api.Errorf(api.CodeInvalidEnv, "flows query", err))
		return
	}
	if !q.Follow {
		held, err = a.flows.query(q)
	} else {
		var cancel func()
		if held, ch, cancel, err = a.flows.follow(q); err == nil {
			defer cancel()
		}
	}
	match := q.Matcher()
	if err != nil {
		writeError(w, api.Errorf(api.CodeIOFailure, "read flows", err))
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := newLineEncoder(w)
	for _, f := range held {
		if enc.encode(f) != nil {
			return
		}
	}
	if ch == nil {
		return
	}
	enc.flush()
	for {
		select {
		case <-r.Context().Done():
			return
		case f := <-ch:
			if !match(f) {
				continue
			}
			if enc.encode(f) != nil {
				return
			}
			enc.flush()
		}
	}
}

package agent

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/policy"
)

// policyState is what the agent has loaded into the datapath's policy
// maps: the compiled result and where each endpoint's entries live.
type policyState struct {
	compiler  *policy.Compiler
	loaded    *policy.Result
	endpoints map[string]datapath.PolicyEndpoint
	pruned    bool
	lastErr   string
	applied   time.Time
	// acks is what this node programmed of each cluster policy, for its
	// Node report; replaced, never changed in place. acked (Kubernetes
	// mode) signals, through one slot, that it changed.
	acks  map[string]k8s.PolicyAck
	acked chan struct{}
	// A failed load is retried with the last snapshot after retryDelay,
	// doubling from policyRetryMin to policyRetryMax, without waiting for
	// a cluster event: the endpoints it closed stay closed until then.
	last       k8s.Snapshot
	retry      *time.Timer
	retryDelay time.Duration
	stopped    bool
}

// newCompiler returns the agent's compiler. Its CIDR and key budgets are
// half the datapath's CIDR and policy maps, so a change always fits beside
// the state it replaces (new entries are written before stale ones go): a
// policy over them is refused, not written into a map that would then
// fail for all.
func (a *Agent) newCompiler() *policy.Compiler {
	c := policy.NewCompiler()
	if n, err := a.dp.MapCapacity(datapath.MapCIDRIdentities); err == nil {
		c.MaxCIDRs = n / 2
	} else {
		a.log.Warn("CIDR map capacity unknown; NetworkPolicy ipBlocks are not bounded", "err", err)
	}
	if n, err := a.dp.MapCapacity(datapath.MapPolicy); err == nil {
		c.MaxKeys = n / 2
	} else {
		a.log.Warn("policy map capacity unknown; policy keys per namespace are not bounded", "err", err)
	}
	return c
}

// Back-off of a failed policy load's retries.
const (
	policyRetryMin = 100 * time.Millisecond
	policyRetryMax = 30 * time.Second
)

// scheduleRetryLocked arms the retry of a failed load, once.
func (a *Agent) scheduleRetryLocked() {
	st := &a.policy
	if st.retry != nil || st.stopped {
		return
	}
	st.retryDelay = min(max(2*st.retryDelay, policyRetryMin), policyRetryMax)
	a.log.Warn("policy load failed; its endpoints stay closed until a retry succeeds", "retry in", st.retryDelay)
	st.retry = time.AfterFunc(st.retryDelay, a.retryPolicy)
}

// retryPolicy loads the last snapshot again.
func (a *Agent) retryPolicy() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.policy.retry = nil
	if a.policy.stopped {
		return
	}
	a.applyPolicyLocked(a.policy.last)
}

// stopPolicyRetries cancels a pending retry and refuses new ones.
func (a *Agent) stopPolicyRetries() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.policy.stopped = true
	if a.policy.retry != nil {
		a.policy.retry.Stop()
		a.policy.retry = nil
	}
}

// policySnapshot converts the cluster state into the compiler's input.
// Local endpoints come from this node's leases, so a pod is enforced on
// as soon as its veth exists, before the API server has its address.
func (a *Agent) policySnapshot(s k8s.Snapshot, local map[string]datapath.PolicyEndpoint, localIPs map[string][]netip.Addr) *policy.Snapshot {
	ps := &policy.Snapshot{
		Namespaces:      map[string]policy.Namespace{},
		Policies:        s.Policies,
		HTTP:            s.HTTP,
		ClusterPolicies: s.ClusterPolicies,
		Identities:      s.Identities,
		HostIPs:         []netip.Addr{a.cfg.NodeIP},
	}
	for name, labels := range s.Namespaces {
		ps.Namespaces[name] = policy.Namespace{Name: name, Labels: labels}
	}
	for _, n := range s.Nodes {
		pn := policy.Node{Name: n.Name, Labels: n.Labels}
		if n.InternalIP.IsValid() {
			pn.IPs = []netip.Addr{n.InternalIP}
		}
		if n.Name == a.cfg.NodeName && a.cfg.NodeIP.IsValid() && a.cfg.NodeIP != n.InternalIP {
			pn.IPs = append(pn.IPs, a.cfg.NodeIP)
		}
		ps.Nodes = append(ps.Nodes, pn)
		if n.InternalIP.IsValid() && n.InternalIP != a.cfg.NodeIP {
			ps.RemoteNodeIPs = append(ps.RemoteNodeIPs, n.InternalIP)
		}
	}
	for _, p := range s.ClusterPods {
		if p.Terminal {
			continue
		}
		pp := policy.Pod{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels, IPs: p.IPs, HostNetwork: p.HostNetwork}
		if p.NodeName == a.cfg.NodeName {
			_, pp.Local = local[p.Key()]
			if ips, ok := localIPs[p.Key()]; ok {
				pp.IPs = ips
			}
		}
		for _, cp := range p.Ports {
			if proto, err := policy.ParseProtocol(cp.Protocol); err == nil && cp.Port > 0 && cp.Port < 65536 {
				pp.Ports = append(pp.Ports, policy.NamedPort{Name: cp.Name, Port: uint16(cp.Port), Protocol: proto})
			}
		}
		ps.Pods = append(ps.Pods, pp)
	}
	return ps
}

// localEndpointsLocked maps this node's pods to their veths and addresses.
func (a *Agent) localEndpointsLocked() (map[string]datapath.PolicyEndpoint, map[string][]netip.Addr, error) {
	entries, err := a.dp.Endpoints()
	if err != nil {
		return nil, nil, err
	}
	ifindex := make(map[netip.Addr]int, len(entries))
	for _, e := range entries {
		ifindex[e.Addr] = e.HostIfindex
	}
	eps := map[string]datapath.PolicyEndpoint{}
	ips := map[string][]netip.Addr{}
	for _, l := range a.ipam.List() {
		idx, ok := ifindex[l.Addr]
		if !ok || l.PodName == "" {
			continue // not published yet, or not a pod
		}
		key := l.PodNamespace + "/" + l.PodName
		eps[key] = datapath.PolicyEndpoint{Ifindex: idx}
		ips[key] = append(ips[key], l.Addr)
	}
	return eps, ips, nil
}

// applyPolicyLocked compiles the snapshot and loads the difference. It
// returns the label sets of local pods that still need an identity.
func (a *Agent) applyPolicyLocked(s k8s.Snapshot) []policy.Labels {
	st := &a.policy
	if st.compiler == nil {
		st.compiler = a.newCompiler()
	}
	st.last = s
	start := time.Now()
	eps, ips, err := a.localEndpointsLocked()
	if err != nil {
		a.log.Error("list endpoints for policy", "err", err)
		a.metrics.reconciled(time.Since(start), nil, nil, err)
		a.scheduleRetryLocked()
		return nil
	}
	input := a.policySnapshot(s, eps, ips)
	compileStart := time.Now()
	res := st.compiler.Compile(input)
	loadStart := time.Now()
	for _, e := range res.Errors {
		a.log.Warn("network policy not fully compiled; its pods fail closed", "err", e)
	}
	a.policyEvents.report(s.Policies, s.HTTP, res.Errors)
	for pod, ep := range res.Endpoints {
		loc := eps[pod]
		loc.Identity = ep.Identity
		eps[pod] = loc
	}
	prev := a.forgetMovedLocked(eps)
	d := policy.DiffResults(prev, res)
	all := mergeEndpoints(st.endpoints, eps)
	err = a.dp.ApplyPolicy(d, all)
	if err == nil && !st.pruned {
		err = a.dp.PrunePolicy(res, eps)
		st.pruned = err == nil
	}
	if err != nil {
		st.lastErr = err.Error()
		a.log.Error("load policy", "err", err)
		a.scheduleRetryLocked()
	} else {
		st.lastErr = ""
		st.retryDelay = 0
		a.ackPoliciesLocked(input, res.Errors)
	}
	st.loaded, st.endpoints, st.applied = res, eps, time.Now()
	if err != nil {
		// Which entries the failed load wrote is unknown: the next pass
		// writes everything again and prunes the rest, rather than
		// diffing against a state the maps may not hold.
		st.loaded, st.pruned = nil, false
	}
	loaded := time.Now()
	a.metrics.reconciled(loaded.Sub(start), res, eps, err)
	a.flowNames.Store(newFlowNames(s, eps, res))
	if err == nil && !d.Empty() {
		a.pruneVerdictCounts(res, eps)
	}
	if !d.Empty() {
		a.log.Info("policy loaded", "endpoints", len(d.Endpoints), "ipcache+", len(d.IPCacheUpsert),
			"ipcache-", len(d.IPCacheDelete), "cidrs", len(res.CIDRs), "policies", len(s.Policies),
			"prepare", compileStart.Sub(start), "compile", loadStart.Sub(compileStart), "load", loaded.Sub(loadStart))
	}
	var missing []policy.Labels
	local := labelKeysInUse(s, s.Pods)
	for _, key := range res.Unallocated {
		if local[key] {
			missing = append(missing, policy.ParseLabelsKey(key))
		}
	}
	return missing
}

// forgetMovedLocked removes from the loaded state every endpoint whose veth
// changed (a pod re-created under its old name), after deleting its
// entries under the old veth, so the diff re-adds it in full.
func (a *Agent) forgetMovedLocked(now map[string]datapath.PolicyEndpoint) *policy.Result {
	st := &a.policy
	if st.loaded == nil {
		return nil
	}
	prev := *st.loaded
	prev.Endpoints = make(map[string]*policy.EndpointPolicy, len(st.loaded.Endpoints))
	for pod, ep := range st.loaded.Endpoints {
		old, had := st.endpoints[pod]
		cur, has := now[pod]
		if had && has && old.Ifindex != cur.Ifindex {
			gone := policy.Diff{Endpoints: []policy.EndpointDiff{{Pod: pod, Gone: true, Delete: keysOf(ep.Entries)}}}
			if err := a.dp.ApplyPolicy(gone, map[string]datapath.PolicyEndpoint{pod: old}); err != nil {
				a.log.Error("remove policy of a replaced veth", "pod", pod, "err", err)
			}
			continue
		}
		prev.Endpoints[pod] = ep
	}
	return &prev
}

func keysOf(m map[policy.Key]policy.Entry) []policy.Key {
	out := make([]policy.Key, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// mergeEndpoints lets a diff reach endpoints that just left (their entries
// are deleted under the veth they had).
func mergeEndpoints(old, now map[string]datapath.PolicyEndpoint) map[string]datapath.PolicyEndpoint {
	out := make(map[string]datapath.PolicyEndpoint, len(old)+len(now))
	for k, v := range old {
		out[k] = v
	}
	for k, v := range now {
		out[k] = v
	}
	return out
}

// allocateIdentities creates the cluster identities local pods lack. It
// runs outside the agent lock: the identity informer brings the result
// back as a change.
func (a *Agent) allocateIdentities(ctx context.Context, alloc func(context.Context, policy.Labels) (policy.Identity, error), missing []policy.Labels) {
	for _, l := range missing {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		id, err := alloc(actx, l)
		cancel()
		if err != nil {
			a.log.Warn("allocate security identity", "labels", l.Key(), "err", err)
			continue
		}
		a.log.Info("security identity", "id", id, "labels", l)
	}
}

// identityGCEvery is how often an agent looks for unused identities;
// identityGrace how long one must stay unused before it goes.
const (
	identityGCEvery = 30 * time.Second
	identityGrace   = 2 * time.Minute
)

// identityWork allocates identities in the background, one label set at a
// time, and never twice at once.
type identityWork struct {
	clients   k8s.Clients
	collector *k8s.IdentityCollector
	mu        sync.Mutex
	inflight  map[string]bool
}

func newIdentityWork(c k8s.Clients) *identityWork {
	return &identityWork{clients: c, collector: k8s.NewIdentityCollector(c.Dynamic, identityGrace), inflight: map[string]bool{}}
}

// allocate starts allocations for the label sets not already in flight.
func (w *identityWork) allocate(ctx context.Context, a *Agent, missing []policy.Labels) {
	if w == nil || len(missing) == 0 {
		return
	}
	var todo []policy.Labels
	w.mu.Lock()
	for _, l := range missing {
		if !w.inflight[l.Key()] {
			w.inflight[l.Key()] = true
			todo = append(todo, l)
		}
	}
	w.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	go func() {
		a.allocateIdentities(ctx, func(ctx context.Context, l policy.Labels) (policy.Identity, error) {
			return k8s.AllocateIdentity(ctx, w.clients.Dynamic, l)
		}, todo)
		w.mu.Lock()
		for _, l := range todo {
			delete(w.inflight, l.Key())
		}
		w.mu.Unlock()
	}()
}

// collectIdentities deletes identities no pod in the cluster has used for
// the grace period.
func (a *Agent) collectIdentities(ctx context.Context, s k8s.Snapshot) {
	if a.identities == nil {
		return
	}
	inUse := labelKeysInUse(s, s.ClusterPods)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	deleted, err := a.identities.collector.Collect(cctx, s.IdentityObjects, inUse)
	if err != nil {
		a.log.Warn("collect unused identities", "err", err)
	}
	if len(deleted) > 0 {
		a.log.Info("unused security identities deleted", "ids", deleted)
	}
}

// labelKeysInUse is the identity label set keys of the pod-network pods
// among pods that still hold an address.
func labelKeysInUse(s k8s.Snapshot, pods []k8s.Pod) map[string]bool {
	out := map[string]bool{}
	for _, p := range pods {
		if !p.HostNetwork && !p.Terminal {
			ns := policy.Namespace{Name: p.Namespace, Labels: s.Namespaces[p.Namespace]}
			out[policy.IdentityLabels(ns, p.Labels).Key()] = true
		}
	}
	return out
}

// verdictPruner is the datapath's verdict counter clean-up; *datapath.Node
// has it.
type verdictPruner interface {
	PruneVerdictCounts(keep func(datapath.VerdictCount) bool) error
}

// pruneVerdictCounts drops the counters of rules no longer loaded and of
// endpoints gone, so their metric series end.
func (a *Agent) pruneVerdictCounts(res *policy.Result, eps map[string]datapath.PolicyEndpoint) {
	p, ok := a.dp.(verdictPruner)
	if !ok {
		return
	}
	ifindexes := map[int]bool{}
	for _, ep := range eps {
		ifindexes[ep.Ifindex] = true
	}
	loaded := func(id policy.RuleID) bool {
		_, ok := res.Rules[id]
		return id == 0 || ok
	}
	err := p.PruneVerdictCounts(func(c datapath.VerdictCount) bool {
		return loaded(c.Rule) && loaded(c.Log) && (c.Ifindex == 0 || ifindexes[c.Ifindex])
	})
	if err != nil {
		a.log.Warn("prune verdict counters", "err", err)
	}
}

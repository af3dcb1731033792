package agent

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/service"
)

// serviceState is what the agent last programmed into the service maps.
type serviceState struct {
	applied bool
	// awaitingSync: the agent follows Kubernetes and has not yet had
	// the cluster's Services whole. Until then nothing is written, so
	// the Services a previous run left in the pinned maps keep being
	// balanced (and hostPorts wait for the first sync, which writes
	// them with the Services).
	awaitingSync bool
	// cache holds the cluster's Services, updated one changed Service at
	// a time; nil before the first update.
	cache *service.Cache
	// table is what the maps hold: the cache's table with this node's
	// pods' hostPorts (hostPorts, owned as hostPortOwners says) where no
	// Service has the frontend.
	table          service.Table
	hostPorts      service.Table
	hostPortOwners map[service.Frontend]string
	// lastErr is why the last write failed.
	lastErr string
	// nodeAddrs are the node addresses last written for NodePorts
	// (nodeAddrsSet: that write succeeded).
	nodeAddrs    []netip.Addr
	nodeAddrsSet bool
}

// serviceCacheLocked is the cache of the cluster's Services, made on first
// use with this node's own view until the nodes are known.
func (a *Agent) serviceCacheLocked() *service.Cache {
	if a.services.cache == nil {
		a.services.cache = service.NewCache(a.serviceOptions(nil))
	}
	return a.services.cache
}

// awaitServiceSync makes the agent write no service map entry until the
// first snapshot has brought the cluster's Services whole: for an agent
// that follows Kubernetes, before it serves anything.
func (a *Agent) awaitServiceSync() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.services.awaitingSync = true
}

// syncServicesLocked gives the Service table the cluster's nodes (their
// addresses serve NodePorts; this node's zone narrows hints) and the
// Services changed since the last call: after the watcher synced, the
// first call has every Service, and from then on the maps hold the
// cluster's Services. Only when the nodes change does every Service get
// recomputed.
func (a *Agent) syncServicesLocked(nodes []k8s.Node, updates []k8s.ServiceUpdate) {
	c := a.serviceCacheLocked()
	opts := a.serviceOptions(nodes)
	a.setNodeAddrsLocked(opts.NodeAddrs)
	c.SetOptions(opts)
	for _, u := range updates {
		c.Update(u.Key, u.Service, u.Slices)
	}
	a.services.awaitingSync = false
	a.flushServicesLocked()
}

// setNodeAddrsLocked writes the nodes' addresses, where the NodePorts'
// any-node socket entries serve, when they changed (or the last write
// failed). Beside kube-proxy there are none: it serves NodePorts.
func (a *Agent) setNodeAddrsLocked(addrs []netip.Addr) {
	st := &a.services
	if st.nodeAddrsSet && slices.Equal(addrs, st.nodeAddrs) {
		return
	}
	if err := a.dp.SetNodeAddrs(addrs); err != nil {
		st.nodeAddrsSet = false
		a.log.Error("write node addresses for NodePorts", "err", err)
		return
	}
	st.nodeAddrs, st.nodeAddrsSet = slices.Clone(addrs), true
	a.serviceNames.setNodeAddrs(addrs)
}

// applyServiceUpdates programs the Services the watcher saw change, each
// from its current state: the cost of a change is that Service's, whatever
// the number of Services. Before the first snapshot the updates stay with
// the watcher, for syncServicesLocked to take whole.
func (a *Agent) applyServiceUpdates(take func() []k8s.ServiceUpdate) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.services.awaitingSync {
		return
	}
	updates := take()
	if len(updates) == 0 {
		return
	}
	c := a.serviceCacheLocked()
	for _, u := range updates {
		c.Update(u.Key, u.Service, u.Slices)
	}
	a.flushServicesLocked()
}

// flushServicesLocked recomputes the Services updated since the last flush
// and writes the frontends that changed. A failed write is retried whole
// on the next change, and meanwhile kube-proxy, where it runs, serves the
// frontends the maps lack.
func (a *Agent) flushServicesLocked() {
	c := a.serviceCacheLocked()
	start := time.Now()
	defer func() {
		if took := time.Since(start); took > slowApply {
			a.log.Warn("programming the Services was slow", "took", took)
		}
	}()
	changed := c.Flush()
	if a.healthChecks != nil {
		if err := a.healthChecks.sync(c.HealthChecks()); err != nil {
			a.log.Error("health check node ports", "err", err)
		}
	}
	a.writeServicesLocked(changed...)
}

// clusterServicesLocked is the table of the cluster's Services the maps
// are to hold: none with --socket-lb=false, where kube-proxy answers
// every Service.
func (a *Agent) clusterServicesLocked() service.Table {
	if a.cfg.NoSocketLB || a.services.cache == nil {
		return nil
	}
	return a.services.cache.Table()
}

// writeServicesLocked writes into the service maps what changed among
// the cluster's Services (changed names their frontends) and this node's
// hostPorts. Sockets sent to a backend a frontend no longer has are
// closed once the maps stop picking it. Until a write has succeeded whole
// (after a start or a failure), the maps are rewritten whole.
func (a *Agent) writeServicesLocked(changed ...service.Frontend) {
	st := &a.services
	if st.awaitingSync {
		return
	}
	cluster := a.clusterServicesLocked()
	oldHostPorts := st.hostPorts
	st.hostPorts, st.hostPortOwners = a.hostPortsLocked(cluster)
	if !st.applied {
		a.rewriteServicesLocked(cluster)
		return
	}
	delta := a.serviceDeltaLocked(cluster, slices.Concat(changed, slices.Collect(maps.Keys(oldHostPorts)), slices.Collect(maps.Keys(st.hostPorts))))
	if len(delta) == 0 {
		a.recordProxyHealth(true)
		return
	}
	old, now := service.Table{}, service.Table{}
	for f, e := range delta {
		if have, ok := st.table[f]; ok {
			old[f] = have
		}
		if e != nil {
			now[f] = *e
		}
	}
	if err := a.dp.UpdateServices(delta); err != nil {
		a.servicesFailedLocked(err, len(delta))
		return
	}
	for f, e := range delta {
		if e == nil {
			delete(st.table, f)
		} else {
			st.table[f] = *e
		}
	}
	a.servicesWrittenLocked(old, now, false)
}

// serviceDeltaLocked is what the maps must change among frontends for
// them to hold cluster (the cluster's Services) and this node's
// hostPorts: each frontend's new entry, or nil where it goes.
func (a *Agent) serviceDeltaLocked(cluster service.Table, frontends []service.Frontend) map[service.Frontend]*service.Entry {
	st := &a.services
	delta := map[service.Frontend]*service.Entry{}
	for _, f := range frontends {
		want, ok := cluster[f]
		if !ok {
			want, ok = st.hostPorts[f]
		}
		have, had := st.table[f]
		switch {
		case ok && (!had || !have.Equal(want)):
			delta[f] = &want
		case !ok && had:
			delta[f] = nil
		}
	}
	return delta
}

// rewriteServicesLocked makes the maps hold exactly cluster and this
// node's hostPorts, reading them first: after a restart or a failed write
// the maps are the truth.
func (a *Agent) rewriteServicesLocked(cluster service.Table) {
	st := &a.services
	t := maps.Clone(cluster)
	if t == nil {
		t = service.Table{}
	}
	for f, e := range st.hostPorts {
		t[f] = e
	}
	old, err := a.dp.Services()
	if err != nil {
		old = st.table
	}
	// After a failed write the maps may hold part of it: backends that
	// part removed are gone from the maps but not from st.table, the last
	// write known whole, and their sockets still need closing.
	old = withBackendsOf(old, st.table)
	if err := a.dp.SetServices(t); err != nil {
		a.servicesFailedLocked(err, len(t))
		return
	}
	st.applied, st.table = true, t
	a.servicesWrittenLocked(old, t, true)
}

// withBackendsOf is t with, for each frontend, the backends more has for
// it as well: what either table sends a frontend's sockets to.
func withBackendsOf(t, more service.Table) service.Table {
	out := maps.Clone(t)
	if out == nil {
		out = service.Table{}
	}
	for f, e := range more {
		have := out[f]
		for _, b := range e.Backends {
			if !slices.Contains(have.Backends, b) {
				have.Backends = append(slices.Clip(have.Backends), b)
			}
		}
		out[f] = have
	}
	return out
}

func (a *Agent) servicesFailedLocked(err error, frontends int) {
	st := &a.services
	st.applied, st.lastErr = false, err.Error()
	a.log.Error("program services", "frontends", frontends, "err", err)
	a.recordProxyHealth(false)
	a.serviceEvents.report(err, a.serviceOwnerLocked, a.serviceObjectLocked)
}

// servicesWrittenLocked records a write that succeeded: old and now are
// the written frontends before and after; whole says the maps were
// rewritten whole (a change to a few frontends is logged at debug level:
// endpoints churn).
func (a *Agent) servicesWrittenLocked(old, now service.Table, whole bool) {
	a.services.lastErr = ""
	a.serviceNames.written(old, now, whole, a.serviceOwnerLocked)
	a.recordProxyHealth(true)
	a.serviceEvents.report(nil, a.serviceOwnerLocked, a.serviceObjectLocked)
	if whole {
		a.log.Info("services programmed", "frontends", len(now))
	} else {
		a.log.Debug("services changed", "frontends", len(now), "total", len(a.services.table))
	}
	if removed := service.Removed(old, now); len(removed) > 0 {
		if err := a.dp.CloseServiceSockets(removed, a.podNetNSLocked()); err != nil {
			a.log.Error("close sockets of removed backends", "frontends", len(removed), "err", err)
		}
	}
}

// serviceOwnerLocked names the Service, or the pod's hostPort, frontend f
// belongs to.
func (a *Agent) serviceOwnerLocked(f service.Frontend) string {
	st := &a.services
	if _, ok := a.clusterServicesLocked()[f]; !ok {
		if o, ok := st.hostPortOwners[f]; ok {
			return o
		}
	}
	if st.cache == nil {
		return ""
	}
	return st.cache.Owner(f)
}

// serviceObjectLocked is the Service key names, nil if there is none.
func (a *Agent) serviceObjectLocked(key string) *corev1.Service {
	if a.services.cache == nil {
		return nil
	}
	return a.services.cache.Service(key)
}

// reservedPorts are ports no Service address or hostPort may take on a
// node: the overlay's, which every node's tunnel traffic arrives on.
func (c Config) reservedPorts() []service.PortProto {
	return []service.PortProto{{Port: c.nodeConfig().OverlayPort(), Proto: service.ProtoUDP}}
}

// hostPortsLocked lists this node's pods' hostPorts where cluster (the
// cluster's Services) has no frontend (with no kube-proxy beside the
// agent: they share the NodePort machinery), with the pod owning each.
// Each is a frontend at the node's address (or the mapping's host IP)
// for sockets on the node and for packets from outside, with the pod as
// its one backend; at 127.0.0.1, for the node's own sockets alone. Where
// two pods claim one port, which the scheduler prevents, the first
// attachment in order keeps it.
func (a *Agent) hostPortsLocked(cluster service.Table) (service.Table, map[service.Frontend]string) {
	t, owners := service.Table{}, map[service.Frontend]string{}
	if !a.cfg.KubeProxyReplacement {
		return t, owners
	}
	for _, l := range a.ipam.List() {
		for _, hp := range l.HostPorts {
			addr := hp.HostIP
			if !addr.Is4() || addr.IsUnspecified() {
				addr = a.cfg.NodeIP
			}
			e := service.Entry{Backends: []service.Backend{{Addr: l.Addr, Port: hp.ContainerPort}}}
			scopes := []bool{false, true}
			if addr == service.Loopback {
				scopes = scopes[:1] // no packet from outside is addressed there
			}
			for _, external := range scopes {
				f := service.Frontend{Addr: addr, Port: hp.Port, Proto: hp.Proto, External: external}
				_, byService := cluster[f]
				if _, taken := t[f]; taken || byService {
					a.log.Warn("hostPort already in use on this node", "port", hp.Port, "pod", l.PodNamespace+"/"+l.PodName)
					continue
				}
				t[f], owners[f] = e, l.PodNamespace+"/"+l.PodName+" (hostPort)"
			}
		}
	}
	return t, owners
}

// serviceOptions is whose view the Service table is built for: this node,
// and with no kube-proxy beside it, every node's address for NodePorts.
func (a *Agent) serviceOptions(nodes []k8s.Node) service.Options {
	opts := service.Options{Node: a.cfg.NodeName, ReplaceKubeProxy: a.cfg.KubeProxyReplacement, Reserved: a.cfg.reservedPorts()}
	for _, n := range nodes {
		if n.Name == a.cfg.NodeName {
			opts.Zone = n.Labels[corev1.LabelTopologyZone] // trafficDistribution's hints name it
		}
	}
	if !opts.ReplaceKubeProxy {
		return opts
	}
	if a.cfg.NodeIP.Is4() {
		opts.OwnAddrs = []netip.Addr{a.cfg.NodeIP}
	}
	seen := map[netip.Addr]bool{}
	for _, addr := range append([]netip.Addr{a.cfg.NodeIP}, nodeAddrs(nodes)...) {
		if addr.Is4() && !seen[addr] {
			seen[addr] = true
			opts.NodeAddrs = append(opts.NodeAddrs, addr)
		}
	}
	// Sorted: the same nodes in another order are the same view.
	slices.SortFunc(opts.NodeAddrs, netip.Addr.Compare)
	opts.AddrNode = map[netip.Addr]string{a.cfg.NodeIP: a.cfg.NodeName}
	for _, n := range nodes {
		if n.InternalIP.Is4() {
			opts.AddrNode[n.InternalIP] = n.Name
		}
	}
	return opts
}

func nodeAddrs(nodes []k8s.Node) []netip.Addr {
	out := make([]netip.Addr, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, n.InternalIP)
	}
	return out
}

// podNetNSLocked lists the network namespaces of this node's pods.
func (a *Agent) podNetNSLocked() []string {
	var out []string
	for _, l := range a.ipam.List() {
		if l.NetNS != "" {
			out = append(out, l.NetNS)
		}
	}
	return out
}

// servicesSummaryLocked counts the programmed Services for `weir status`;
// nil before the agent has seen any (it is not a Kubernetes node agent).
func (a *Agent) servicesSummaryLocked() *api.ServicesSummary {
	st := &a.services
	if !st.applied && st.lastErr == "" {
		return nil
	}
	out := &api.ServicesSummary{KubeProxyReplacement: a.cfg.KubeProxyReplacement, SocketLBOff: a.cfg.NoSocketLB, Frontends: len(st.table), Error: st.lastErr}
	for _, e := range st.table {
		out.Backends += len(e.Backends)
		if len(e.Backends) == 0 {
			out.Refusing++
		}
	}
	return out
}

// ServiceList reads the service maps back: what each Service address is
// translated to on this node right now, sorted by address, port and
// protocol.
func (a *Agent) ServiceList() (*api.ServiceList, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, err := a.dp.Services()
	if err != nil {
		return nil, err
	}
	l := &api.ServiceList{
		Node: a.cfg.NodeName, KubeProxyReplacement: a.cfg.KubeProxyReplacement, SocketLBOff: a.cfg.NoSocketLB,
		InSync:    a.services.applied && maps.EqualFunc(t, a.services.table, service.Entry.Equal),
		Frontends: []api.ServiceFrontend{},
	}
	for _, f := range slices.SortedFunc(maps.Keys(t), service.CompareFrontends) {
		e := t[f]
		fe := api.ServiceFrontend{
			Addr: f.Addr, Port: f.Port, Protocol: protocolName(f.Proto), Service: a.serviceOwnerLocked(f), External: f.External,
			Backends: []api.ServiceBackend{}, AffinitySeconds: int(e.AffinityTimeout.Seconds()), State: "serving",
		}
		for _, b := range e.Backends {
			fe.Backends = append(fe.Backends, api.ServiceBackend{Addr: b.Addr, Port: b.Port})
		}
		switch {
		case len(e.Backends) > 0:
		case e.DropWhenEmpty:
			fe.State = "dropping"
		default:
			fe.State = "refusing"
		}
		l.Frontends = append(l.Frontends, fe)
	}
	return l, nil
}

func protocolName(p uint8) string {
	switch p {
	case service.ProtoTCP:
		return "TCP"
	case service.ProtoUDP:
		return "UDP"
	}
	return fmt.Sprintf("proto-%d", p)
}

// recordProxyHealth tells kube-proxy's health endpoint whether the service
// maps match the cluster's Services.
func (a *Agent) recordProxyHealth(ok bool) {
	if a.proxyHealth != nil {
		a.proxyHealth.record(ok, time.Now())
	}
}

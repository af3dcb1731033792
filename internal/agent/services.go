package agent

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/service"
)

// serviceState is what the agent last programmed into the service maps.
type serviceState struct {
	applied bool
	table   service.Table
	// built is the table of the cluster's Services (the last snapshot;
	// nil before one) and builtOwners names its frontends' Services; the
	// maps hold it together with this node's pods' hostPorts.
	built       service.Table
	builtOwners map[service.Frontend]string
	// owners names each programmed frontend's Service or pod; lastErr is
	// why the last write failed.
	owners  map[service.Frontend]string
	lastErr string
}

// applyServicesLocked programs the Services of s for translation at the
// socket. The maps are rewritten only when the table changed; a failed
// write is retried on the next snapshot, and meanwhile kube-proxy, where
// it runs, serves the frontends the maps lack. Sockets sent to a backend
// a frontend no longer has are closed once the maps stop picking it.
func (a *Agent) applyServicesLocked(s k8s.Snapshot) {
	opts := a.serviceOptions(s)
	if a.healthChecks != nil {
		if err := a.healthChecks.sync(service.HealthChecks(s.Services, s.EndpointSlices, a.cfg.NodeName)); err != nil {
			a.log.Error("health check node ports", "err", err)
		}
	}
	if a.cfg.NoSocketLB {
		// kube-proxy answers every Service: the maps stay empty.
		a.services.built, a.services.builtOwners = nil, nil
		a.writeServicesLocked()
		return
	}
	a.serviceEvents.setServices(s.Services)
	a.services.built = service.Build(s.Services, s.EndpointSlices, opts)
	a.services.builtOwners = service.Owners(s.Services, opts)
	a.writeServicesLocked()
}

// writeServicesLocked writes the cluster's Services and this node's
// hostPorts into the service maps, if they changed.
func (a *Agent) writeServicesLocked() {
	t := maps.Clone(a.services.built)
	if t == nil {
		t = service.Table{}
	}
	owners := maps.Clone(a.services.builtOwners)
	if owners == nil {
		owners = map[service.Frontend]string{}
	}
	a.addHostPortsLocked(t, owners)
	if a.services.applied && maps.EqualFunc(t, a.services.table, service.Entry.Equal) {
		a.services.owners = owners
		a.recordProxyHealth(true)
		return
	}
	old := a.services.table
	if !a.services.applied {
		// After a restart or a failed write the maps are the truth.
		if cur, err := a.dp.Services(); err == nil {
			old = cur
		}
	}
	a.services.owners = owners
	if err := a.dp.SetServices(t); err != nil {
		a.services.applied, a.services.lastErr = false, err.Error()
		a.log.Error("program services", "frontends", len(t), "err", err)
		a.recordProxyHealth(false)
		a.serviceEvents.report(err, owners)
		return
	}
	a.services.applied, a.services.table, a.services.lastErr = true, t, ""
	a.recordProxyHealth(true)
	a.serviceEvents.report(nil, owners)
	a.log.Info("services programmed", "frontends", len(t))
	if removed := service.Removed(old, t); len(removed) > 0 {
		if err := a.dp.CloseServiceSockets(removed, a.podNetNSLocked()); err != nil {
			a.log.Error("close sockets of removed backends", "frontends", len(removed), "err", err)
		}
	}
}

// reservedPorts are ports no Service address or hostPort may take on a
// node: the overlay's, which every node's tunnel traffic arrives on.
var reservedPorts = []service.PortProto{{Port: datapath.VXLANPort, Proto: service.ProtoUDP}}

// addHostPortsLocked adds this node's pods' hostPorts to t (with no
// kube-proxy beside the agent: they share the NodePort machinery). Each is
// a frontend at the node's address (or the mapping's host IP) for sockets
// on the node and for packets from outside, with the pod as its one
// backend; at 127.0.0.1, for the node's own sockets alone. Where two pods claim one port, which the scheduler prevents,
// the first attachment in order keeps it.
func (a *Agent) addHostPortsLocked(t service.Table, owners map[service.Frontend]string) {
	if !a.cfg.KubeProxyReplacement {
		return
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
				if _, taken := t[f]; taken {
					a.log.Warn("hostPort already in use on this node", "port", hp.Port, "pod", l.PodNamespace+"/"+l.PodName)
					continue
				}
				t[f], owners[f] = e, l.PodNamespace+"/"+l.PodName+" (hostPort)"
			}
		}
	}
}

// serviceOptions is whose view the Service table is built for: this node,
// and with no kube-proxy beside it, every node's address for NodePorts.
func (a *Agent) serviceOptions(s k8s.Snapshot) service.Options {
	opts := service.Options{Node: a.cfg.NodeName, ReplaceKubeProxy: a.cfg.KubeProxyReplacement, Reserved: reservedPorts}
	for _, n := range s.Nodes {
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
	for _, addr := range append([]netip.Addr{a.cfg.NodeIP}, nodeAddrs(s.Nodes)...) {
		if addr.Is4() && !seen[addr] {
			seen[addr] = true
			opts.NodeAddrs = append(opts.NodeAddrs, addr)
		}
	}
	opts.AddrNode = map[netip.Addr]string{a.cfg.NodeIP: a.cfg.NodeName}
	for _, n := range s.Nodes {
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
	for f, e := range t {
		fe := api.ServiceFrontend{
			Addr: f.Addr, Port: f.Port, Protocol: protocolName(f.Proto), Service: a.services.owners[f], External: f.External,
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
	slices.SortFunc(l.Frontends, func(x, y api.ServiceFrontend) int {
		return cmp.Or(x.Addr.Compare(y.Addr), cmp.Compare(x.Port, y.Port), cmp.Compare(x.Protocol, y.Protocol), boolCompare(x.External, y.External))
	})
	return l, nil
}

func boolCompare(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
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

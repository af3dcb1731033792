package agent

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/service"
)

// serviceState is what the agent last programmed into the service maps.
type serviceState struct {
	applied bool
	table   service.Table
	// owners names each frontend's Service; lastErr is why the last
	// write failed.
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
	t := service.Build(s.Services, s.EndpointSlices, opts)
	if a.healthChecks != nil {
		if err := a.healthChecks.sync(service.HealthChecks(s.Services, s.EndpointSlices, a.cfg.NodeName)); err != nil {
			a.log.Error("health check node ports", "err", err)
		}
	}
	if a.services.applied && maps.EqualFunc(t, a.services.table, service.Entry.Equal) {
		return
	}
	old := a.services.table
	if !a.services.applied {
		// After a restart or a failed write the maps are the truth.
		if cur, err := a.dp.Services(); err == nil {
			old = cur
		}
	}
	a.services.owners = service.Owners(s.Services, opts)
	if err := a.dp.SetServices(t); err != nil {
		a.services.applied, a.services.lastErr = false, err.Error()
		a.log.Error("program services", "frontends", len(t), "err", err)
		return
	}
	a.services = serviceState{applied: true, table: t, owners: a.services.owners}
	a.log.Info("services programmed", "frontends", len(t))
	if removed := service.Removed(old, t); len(removed) > 0 {
		if err := a.dp.CloseServiceSockets(removed, a.podNetNSLocked()); err != nil {
			a.log.Error("close sockets of removed backends", "frontends", len(removed), "err", err)
		}
	}
}

// serviceOptions is whose view the Service table is built for: this node,
// and with no kube-proxy beside it, every node's address for NodePorts.
func (a *Agent) serviceOptions(s k8s.Snapshot) service.Options {
	opts := service.Options{Node: a.cfg.NodeName, ReplaceKubeProxy: a.cfg.KubeProxyReplacement}
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
	out := &api.ServicesSummary{KubeProxyReplacement: a.cfg.KubeProxyReplacement, Frontends: len(st.table), Error: st.lastErr}
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
		Node: a.cfg.NodeName, KubeProxyReplacement: a.cfg.KubeProxyReplacement,
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

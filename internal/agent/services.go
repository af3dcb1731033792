package agent

import (
	"maps"

	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/service"
)

// serviceState is what the agent last programmed into the service maps.
type serviceState struct {
	applied bool
	table   service.Table
}

// applyServicesLocked programs the Services of s for translation at the
// socket. The maps are rewritten only when the table changed; a failed
// write is retried on the next snapshot, and meanwhile kube-proxy, where
// it runs, serves the frontends the maps lack.
func (a *Agent) applyServicesLocked(s k8s.Snapshot) {
	t := service.Build(s.Services, s.EndpointSlices, service.Options{Node: a.cfg.NodeName, ReplaceKubeProxy: a.cfg.KubeProxyReplacement})
	if a.services.applied && maps.EqualFunc(t, a.services.table, service.Entry.Equal) {
		return
	}
	if err := a.dp.SetServices(t); err != nil {
		a.services.applied = false
		a.log.Error("program services", "frontends", len(t), "err", err)
		return
	}
	a.services = serviceState{applied: true, table: t}
	a.log.Info("services programmed", "frontends", len(t))
}

package agent

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/service"
)

// serviceWrites records the service map writes an agent asks for, and
// passes them on to the real datapath.
type serviceWrites struct {
	Datapath
	whole   int // SetServices calls
	updates []map[service.Frontend]*service.Entry
}

func (w *serviceWrites) SetServices(t service.Table) error {
	w.whole++
	return w.Datapath.SetServices(t)
}

func (w *serviceWrites) UpdateServices(c map[service.Frontend]*service.Entry) error {
	w.updates = append(w.updates, maps.Clone(c))
	return w.Datapath.UpdateServices(c)
}

// bulkServices are count ClusterIP Services (two ports each) with one
// EndpointSlice of two endpoints each.
func bulkServices(count int) ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	var svcs []*corev1.Service
	var slices []*discoveryv1.EndpointSlice
	for i := range count {
		name := fmt.Sprintf("bulk-%d", i)
		svcs = append(svcs, clusterIPService(name, fmt.Sprintf("10.96.%d.%d", 10+i/250, 1+i%250)))
		slices = append(slices, readyEndpoints(name, 8080, 5353, netip.MustParseAddr("10.244.1.200"), netip.MustParseAddr("10.244.2.200")))
	}
	return svcs, slices
}

// mapsMatchAgent fails unless the service maps hold exactly what the agent
// says it programmed.
func mapsMatchAgent(t *testing.T, n *testNode, frontends int) {
	t.Helper()
	got, err := n.dp.Services()
	if err != nil {
		t.Fatal(err)
	}
	n.agent.mu.Lock()
	want := maps.Clone(n.agent.services.table)
	n.agent.mu.Unlock()
	if len(got) != frontends || !maps.EqualFunc(got, want, service.Entry.Equal) {
		t.Fatalf("maps hold %d frontends, the agent %d, want %d alike", len(got), len(want), frontends)
	}
}

// TestServiceChangeWritesOnlyItsFrontends: among 2,000 Services, a new
// endpoint of one and the deletion of another reach the datapath as one
// update of those Services' frontends alone, never a rewrite of the
// table; the maps then hold what the cluster says.
func TestServiceChangeWritesOnlyItsFrontends(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	n.stop()
	n.cfg.KubeProxyReplacement = true
	writes := &serviceWrites{}
	n.start(func(d Datapath) Datapath { writes.Datapath = d; return writes })
	svcs, slices := bulkServices(2000)
	n.applyServices(svcs, slices...)
	if writes.whole != 1 {
		t.Fatalf("first sync: %d whole writes, want one", writes.whole)
	}
	mapsMatchAgent(t, n, 4000)

	grown := readyEndpoints("bulk-7", 8080, 5353, netip.MustParseAddr("10.244.1.200"), netip.MustParseAddr("10.244.2.200"), netip.MustParseAddr("10.244.3.200"))
	updates := []k8s.ServiceUpdate{
		{Key: "default/bulk-7", Service: svcs[7], Slices: []*discoveryv1.EndpointSlice{grown}},
		{Key: "default/bulk-8"}, // deleted
	}
	n.agent.applyServiceUpdates(func() []k8s.ServiceUpdate { return updates })
	if writes.whole != 1 || len(writes.updates) != 1 {
		t.Fatalf("after one change: %d whole writes and %d updates, want one update", writes.whole, len(writes.updates))
	}
	u := writes.updates[0]
	http7 := service.Frontend{Addr: netip.MustParseAddr("10.96.10.8"), Port: 80, Proto: service.ProtoTCP}
	dns8 := service.Frontend{Addr: netip.MustParseAddr("10.96.10.9"), Port: 53, Proto: service.ProtoUDP}
	if len(u) != 4 || u[http7] == nil || len(u[http7].Backends) != 3 || u[dns8] != nil {
		t.Errorf("update %v, want bulk-7's two frontends with three backends and bulk-8's two deleted", u)
	}
	mapsMatchAgent(t, n, 3998)

	// Nothing changed: nothing written.
	n.agent.applyServiceUpdates(func() []k8s.ServiceUpdate { return updates[:1] })
	if len(writes.updates) != 1 {
		t.Errorf("an update that changes nothing wrote %v", writes.updates[1:])
	}
}

// TestRestartedAgentKeepsServicesUntilSynced: a restarted agent that
// follows Kubernetes writes nothing into the service maps before its first
// sync, not even a new pod's hostPort, so the Services the last run left
// keep being balanced; updates before that sync stay with the watcher; the
// sync then rewrites the maps to what the cluster says, hostPort included.
func TestRestartedAgentKeepsServicesUntilSynced(t *testing.T) {
	n := newReplacingNode(t, "10.244.1.0/24")
	svcs, slices := bulkServices(50)
	n.applyServices(svcs, slices...)
	mapsMatchAgent(t, n, 100)

	n.stop()
	n.start(nil)
	n.agent.awaitServiceSync() // as runKubernetes does
	taken := false
	n.agent.applyServiceUpdates(func() []k8s.ServiceUpdate { taken = true; return nil })
	if taken {
		t.Error("updates taken before the first sync")
	}
	req := addReq("web", n.newPod())
	req.PortMappings = []api.PortMapping{{HostPort: 30900, ContainerPort: 8080, Protocol: "tcp"}}
	if _, err := n.agent.Add(req); err != nil {
		t.Fatal(err)
	}
	got, err := n.dp.Services()
	if err != nil {
		t.Fatal(err)
	}
	web := service.Frontend{Addr: netip.MustParseAddr("10.96.10.1"), Port: 80, Proto: service.ProtoTCP}
	if len(got) != 100 || len(got[web].Backends) != 2 {
		t.Fatalf("before the sync the maps hold %d frontends (bulk-0 %v), want the last run's 100 untouched", len(got), got[web])
	}

	n.applyServices(svcs[:40], slices...)
	mapsMatchAgent(t, n, 82)
	hostPort := service.Frontend{Addr: n.cfg.NodeIP, Port: 30900, Proto: service.ProtoTCP}
	if got, _ := n.dp.Services(); len(got[hostPort].Backends) != 1 {
		t.Errorf("after the sync the hostPort has %v, want the pod", got[hostPort])
	}
}

// partialWrites passes writes on to the real datapath, except that the
// next UpdateServices, when failNext is set, writes one frontend of its
// change and fails, as a map filling up midway would; it records the
// sockets the agent asks to close.
type partialWrites struct {
	Datapath
	failNext bool
	closed   map[service.Frontend][]service.Backend
}

var errHalfWritten = errors.New("map full after one frontend")

func (w *partialWrites) UpdateServices(c map[service.Frontend]*service.Entry) error {
	if !w.failNext {
		return w.Datapath.UpdateServices(c)
	}
	w.failNext = false
	first := slices.MinFunc(slices.Collect(maps.Keys(c)), service.CompareFrontends)
	if err := w.Datapath.UpdateServices(map[service.Frontend]*service.Entry{first: c[first]}); err != nil {
		return err
	}
	return errHalfWritten
}

func (w *partialWrites) CloseServiceSockets(removed map[service.Frontend][]service.Backend, netns []string) error {
	for f, bs := range removed {
		w.closed[f] = append(w.closed[f], bs...)
	}
	return w.Datapath.CloseServiceSockets(removed, netns)
}

// TestPartlyFailedWriteStillClosesRemovedBackends: a write that fails
// after removing a backend from one frontend leaves the agent's record
// of the maps behind them; the rewrite that follows still closes the
// sockets of that backend, on every frontend that lost it.
func TestPartlyFailedWriteStillClosesRemovedBackends(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	n.stop()
	n.cfg.KubeProxyReplacement = true
	w := &partialWrites{closed: map[service.Frontend][]service.Backend{}}
	n.start(func(d Datapath) Datapath { w.Datapath = d; return w })
	a, b := netip.MustParseAddr("10.244.1.200"), netip.MustParseAddr("10.244.2.200")
	web := []*corev1.Service{clusterIPService("web", "10.96.0.10")}
	n.applyServices(web, readyEndpoints("web", 8080, 5353, a, b))

	w.failNext = true
	n.agent.mu.Lock()
	n.agent.syncServicesLocked(nil, []k8s.ServiceUpdate{{Key: service.Key("default", "web"), Service: web[0],
		Slices: []*discoveryv1.EndpointSlice{readyEndpoints("web", 8080, 5353, a)}}})
	applied := n.agent.services.applied
	n.agent.mu.Unlock()
	if applied {
		t.Fatal("the failed write counts as applied")
	}
	n.applyServices(web, readyEndpoints("web", 8080, 5353, a))
	mapsMatchAgent(t, n, 2)
	for _, f := range []service.Frontend{
		{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Proto: service.ProtoTCP},
		{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: service.ProtoUDP},
	} {
		if !slices.ContainsFunc(w.closed[f], func(be service.Backend) bool { return be.Addr == b }) {
			t.Errorf("%v: sockets to the removed backend %v never closed (closed: %v)", f, b, w.closed)
		}
	}
}

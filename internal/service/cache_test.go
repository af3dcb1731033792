package service

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// randomService is one of a few Services whose addresses collide often:
// externalIPs that are another Service's ClusterIP, shared NodePorts,
// several types and traffic policies.
func randomService(r *rand.Rand, name string) *corev1.Service {
	ip := fmt.Sprintf("10.96.0.%d", 1+r.IntN(4))
	s := svc(name, ip, corev1.ServicePort{Name: "http", Port: 80, NodePort: int32(30080 + r.IntN(2)), Protocol: corev1.ProtocolTCP})
	s.CreationTimestamp = metav1.NewTime(time.Unix(int64(r.IntN(3)), 0))
	switch r.IntN(4) {
	case 0:
		s.Spec.Type = corev1.ServiceTypeNodePort
	case 1:
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.HealthCheckNodePort = 32000 + int32(r.IntN(2))
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: fmt.Sprintf("10.96.0.%d", 1+r.IntN(4))}}
	}
	if r.IntN(2) == 0 {
		s.Spec.ExternalIPs = []string{fmt.Sprintf("10.96.0.%d", 1+r.IntN(4))}
	}
	if r.IntN(3) == 0 {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	if r.IntN(4) == 0 {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	}
	return s
}

func randomSlices(r *rand.Rand, name string) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for i := range r.IntN(3) {
		var eps []ep
		for range r.IntN(3) {
			eps = append(eps, ep{addr: fmt.Sprintf("10.0.%d.%d", r.IntN(2), 2+r.IntN(3)), node: fmt.Sprintf("n%d", 1+r.IntN(2)), ready: r.IntN(4) > 0, terminated: r.IntN(2) == 0})
		}
		s := slice(name, map[string]int32{"http": 8080}, eps...)
		s.Name = fmt.Sprintf("%s-%d", name, i)
		out = append(out, s)
	}
	return out
}

// TestCacheFollowsChangesOneServiceAtATime: after any sequence of Service
// and EndpointSlice changes, deletions and option changes, a Cache updated
// one Service at a time holds the table and owners a Cache filled at once
// with the same state does, and each Flush names exactly the frontends
// whose entry or owner changed.
func TestCacheFollowsChangesOneServiceAtATime(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	names := []string{"a", "b", "c", "d", "e", "f"}
	n1, n2 := netip.MustParseAddr("10.99.0.11"), netip.MustParseAddr("10.99.0.12")
	views := []Options{
		{Node: "n1", ReplaceKubeProxy: true, NodeAddrs: []netip.Addr{n1, n2}, OwnAddrs: []netip.Addr{n1}, AddrNode: map[netip.Addr]string{n1: "n1", n2: "n2"}},
		{Node: "n1", ReplaceKubeProxy: true, NodeAddrs: []netip.Addr{n1}, OwnAddrs: []netip.Addr{n1}, AddrNode: map[netip.Addr]string{n1: "n1"}},
		{Node: "n1"},
	}
	opts := views[0]
	c := NewCache(opts)
	svcs := map[string]*corev1.Service{}
	bySvc := map[string][]*discoveryv1.EndpointSlice{}
	for step := range 2000 {
		name := names[r.IntN(len(names))]
		key := Key("ns", name)
		switch r.IntN(10) {
		case 0:
			delete(svcs, key)
		case 1:
			delete(bySvc, key)
		case 2:
			opts = views[r.IntN(len(views))]
			c.SetOptions(opts)
		case 3, 4, 5:
			svcs[key] = randomService(r, name)
		default:
			bySvc[key] = randomSlices(r, name)
		}
		c.Update(key, svcs[key], bySvc[key])
		oldTable, oldOwners := maps.Clone(c.Table()), maps.Clone(c.owners)
		changed := c.Flush()

		var all []*corev1.Service
		var allSlices []*discoveryv1.EndpointSlice
		for _, k := range slices.Sorted(maps.Keys(svcs)) {
			all = append(all, svcs[k])
		}
		for _, k := range slices.Sorted(maps.Keys(bySvc)) {
			allSlices = append(allSlices, bySvc[k]...)
		}
		want := filled(all, allSlices, opts)
		if !maps.EqualFunc(c.Table(), want.Table(), Entry.Equal) {
			t.Fatalf("step %d: incremental table\n %v\nfilled at once\n %v", step, c.Table(), want.Table())
		}
		if !maps.Equal(c.owners, want.owners) {
			t.Fatalf("step %d: incremental owners %v, filled at once %v", step, c.owners, want.owners)
		}
		if hc, wantHC := c.HealthChecks(), HealthChecks(all, allSlices, opts.Node); !maps.Equal(hc, wantHC) {
			t.Fatalf("step %d: health checks %v, want %v", step, hc, wantHC)
		}
		var wantChanged []Frontend
		for f := range unionKeys(oldTable, c.Table(), oldOwners, c.owners) {
			o, had := oldTable[f]
			n, has := c.Table()[f]
			if had != has || !o.Equal(n) || oldOwners[f] != c.owners[f] {
				wantChanged = append(wantChanged, f)
			}
		}
		slices.SortFunc(wantChanged, CompareFrontends)
		if !slices.Equal(changed, wantChanged) {
			t.Fatalf("step %d: Flush reported %v, changed %v", step, changed, wantChanged)
		}
	}
}

func unionKeys(t1, t2 Table, o1, o2 map[Frontend]string) map[Frontend]bool {
	out := map[Frontend]bool{}
	for _, t := range []Table{t1, t2} {
		for f := range t {
			out[f] = true
		}
	}
	for _, o := range []map[Frontend]string{o1, o2} {
		for f := range o {
			out[f] = true
		}
	}
	return out
}

// TestCacheChangeTouchesOnlyItsService: among 5,000 Services, a new
// endpoint of one recomputes that Service alone, and Flush names its
// frontend alone; the loser of a shared frontend takes it over when the
// winner goes.
func TestCacheChangeTouchesOnlyItsService(t *testing.T) {
	c := NewCache(Options{Node: "n1", ReplaceKubeProxy: true})
	for i := range 5000 {
		name := fmt.Sprintf("s%d", i)
		c.Update(Key("ns", name), svc(name, fmt.Sprintf("10.96.%d.%d", i/250, 1+i%250), corev1.ServicePort{Name: "http", Port: 80}),
			[]*discoveryv1.EndpointSlice{slice(name, map[string]int32{"http": 8080}, ep{addr: "10.0.0.2", ready: true})})
	}
	if got := len(c.Flush()); got != 5000 {
		t.Fatalf("first flush: %d frontends changed, want 5000", got)
	}
	if got := c.Flush(); len(got) != 0 {
		t.Errorf("flush without updates: %v changed", got)
	}
	c.Update(Key("ns", "s7"), c.Service(Key("ns", "s7")), []*discoveryv1.EndpointSlice{
		slice("s7", map[string]int32{"http": 8080}, ep{addr: "10.0.0.2", ready: true}, ep{addr: "10.0.0.3", ready: true})})
	if got := c.Flush(); !slices.Equal(got, []Frontend{fe("10.96.0.8", 80)}) {
		t.Errorf("one endpoint added: %v changed, want s7's ClusterIP alone", got)
	}
	if e := c.Table()[fe("10.96.0.8", 80)]; len(e.Backends) != 2 {
		t.Errorf("s7: %v, want two backends", e)
	}

	// s8 also claims s7's ClusterIP as an external IP: s7 keeps it.
	s8 := c.Service(Key("ns", "s8")).DeepCopy()
	s8.Spec.ExternalIPs = []string{"10.96.0.8"}
	c.Update(Key("ns", "s8"), s8, nil)
	c.Flush()
	if c.Owner(fe("10.96.0.8", 80)) != "ns/s7" {
		t.Errorf("shared frontend owned by %q, want the ClusterIP's Service", c.Owner(fe("10.96.0.8", 80)))
	}
	c.Update(Key("ns", "s7"), nil, nil)
	got := c.Flush()
	if c.Owner(fe("10.96.0.8", 80)) != "ns/s8" || !slices.Contains(got, fe("10.96.0.8", 80)) {
		t.Errorf("after s7 is deleted the frontend is owned by %q (changed %v), want s8", c.Owner(fe("10.96.0.8", 80)), got)
	}
	if e := c.Table()[fe("10.96.0.8", 80)]; len(e.Backends) != 0 {
		t.Errorf("s8's external IP: %v, want s8's entry (no endpoints: refusing)", e)
	}
	if len(c.Keys()) != 4999 {
		t.Errorf("%d Services held, want 4999", len(c.Keys()))
	}
}

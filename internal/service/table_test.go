package service

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func svc(name string, ip string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec:       corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, Ports: ports},
	}
}

type ep struct {
	addr              string
	node              string
	ready, terminated bool
	notServing        bool
	// forZones and forNodes are the EndpointSlice controller's hints.
	forZones, forNodes []string
}

func slice(svcName string, ports map[string]int32, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: svcName + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for name, port := range ports {
		proto := corev1.ProtocolTCP
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: &name, Port: &port, Protocol: &proto})
	}
	for _, e := range eps {
		ready, serving, term := e.ready, !e.notServing, e.terminated
		endpoint := discoveryv1.Endpoint{
			Addresses:  []string{e.addr},
			NodeName:   &e.node,
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &term},
		}
		if len(e.forZones)+len(e.forNodes) > 0 {
			endpoint.Hints = &discoveryv1.EndpointHints{}
			for _, z := range e.forZones {
				endpoint.Hints.ForZones = append(endpoint.Hints.ForZones, discoveryv1.ForZone{Name: z})
			}
			for _, n := range e.forNodes {
				endpoint.Hints.ForNodes = append(endpoint.Hints.ForNodes, discoveryv1.ForNode{Name: n})
			}
		}
		s.Endpoints = append(s.Endpoints, endpoint)
	}
	return s
}

func fe(ip string, port uint16) Frontend {
	return Frontend{Addr: netip.MustParseAddr(ip), Port: port, Proto: ProtoTCP}
}

func be(ip string, port uint16) Backend { return Backend{Addr: netip.MustParseAddr(ip), Port: port} }

func TestBuild(t *testing.T) {
	local := corev1.ServiceInternalTrafficPolicyLocal
	http := corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}
	tests := []struct {
		name   string
		svcs   []*corev1.Service
		slices []*discoveryv1.EndpointSlice
		want   Table
	}{{
		name: "ready endpoints of two slices, sorted, duplicates once",
		svcs: []*corev1.Service{svc("web", "10.96.0.10", http)},
		slices: []*discoveryv1.EndpointSlice{
			slice("web", map[string]int32{"http": 8080}, ep{addr: "10.0.1.3", ready: true}, ep{addr: "10.0.0.2", ready: true}),
			slice("web", map[string]int32{"http": 8080}, ep{addr: "10.0.0.2", ready: true}, ep{addr: "10.0.0.9"}),
		},
		want: Table{fe("10.96.0.10", 80): {Backends: []Backend{be("10.0.0.2", 8080), be("10.0.1.3", 8080)}}},
	}, {
		name: "named target port differs per slice",
		svcs: []*corev1.Service{svc("web", "10.96.0.10", http)},
		slices: []*discoveryv1.EndpointSlice{
			slice("web", map[string]int32{"http": 8080}, ep{addr: "10.0.0.2", ready: true}),
			slice("web", map[string]int32{"http": 9090}, ep{addr: "10.0.0.3", ready: true}),
			slice("web", map[string]int32{"metrics": 9100}, ep{addr: "10.0.0.4", ready: true}),
		},
		want: Table{fe("10.96.0.10", 80): {Backends: []Backend{be("10.0.0.2", 8080), be("10.0.0.3", 9090)}}},
	}, {
		name: "terminating serving endpoints only when none is ready",
		svcs: []*corev1.Service{svc("a", "10.96.0.1", http), svc("b", "10.96.0.2", http)},
		slices: []*discoveryv1.EndpointSlice{
			slice("a", map[string]int32{"http": 80}, ep{addr: "10.0.0.2", terminated: true}, ep{addr: "10.0.0.3", ready: true}),
			slice("b", map[string]int32{"http": 80}, ep{addr: "10.0.0.4", terminated: true}, ep{addr: "10.0.0.5", terminated: true, notServing: true}),
		},
		want: Table{fe("10.96.0.1", 80): {Backends: []Backend{be("10.0.0.3", 80)}}, fe("10.96.0.2", 80): {Backends: []Backend{be("10.0.0.4", 80)}}},
	}, {
		name: "no backend: left to kube-proxy",
		svcs: []*corev1.Service{svc("web", "10.96.0.10", http)},
		slices: []*discoveryv1.EndpointSlice{
			slice("web", map[string]int32{"http": 80}, ep{addr: "10.0.0.2"}),
		},
		want: Table{},
	}, {
		name: "internalTrafficPolicy Local keeps this node's endpoints",
		svcs: func() []*corev1.Service {
			s := svc("web", "10.96.0.10", http)
			s.Spec.InternalTrafficPolicy = &local
			return []*corev1.Service{s}
		}(),
		slices: []*discoveryv1.EndpointSlice{
			slice("web", map[string]int32{"http": 80}, ep{addr: "10.0.0.2", ready: true, node: "n1"}, ep{addr: "10.0.1.2", ready: true, node: "n2"}),
		},
		want: Table{fe("10.96.0.10", 80): {Backends: []Backend{be("10.0.0.2", 80)}}},
	}, {
		name: "headless, ExternalName, affinity and SCTP are not translated",
		svcs: func() []*corev1.Service {
			headless := svc("h", "None", http)
			ext := svc("e", "", http)
			ext.Spec.Type = corev1.ServiceTypeExternalName
			aff := svc("a", "10.96.0.3", http)
			aff.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			sctp := svc("s", "10.96.0.4", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolSCTP})
			return []*corev1.Service{headless, ext, aff, sctp}
		}(),
		slices: []*discoveryv1.EndpointSlice{
			slice("h", map[string]int32{"http": 80}, ep{addr: "10.0.0.2", ready: true}),
			slice("a", map[string]int32{"http": 80}, ep{addr: "10.0.0.2", ready: true}),
			slice("s", map[string]int32{"http": 80}, ep{addr: "10.0.0.2", ready: true}),
		},
		want: Table{},
	}, {
		name: "a slice of another namespace does not count",
		svcs: []*corev1.Service{svc("web", "10.96.0.10", http)},
		slices: func() []*discoveryv1.EndpointSlice {
			s := slice("web", map[string]int32{"http": 80}, ep{addr: "10.0.0.2", ready: true})
			s.Namespace = "other"
			return []*discoveryv1.EndpointSlice{s}
		}(),
		want: Table{},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Build(tt.svcs, tt.slices, Options{Node: "n1"})
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Build:\n got %v\nwant %v", got, tt.want)
			}
		})
	}
}

func TestBuildUDPAndDefaultProtocol(t *testing.T) {
	s := svc("dns", "10.96.0.10",
		corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
		corev1.ServicePort{Name: "dns-tcp", Port: 53})
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	name1, name2, p := "dns", "dns-tcp", int32(5353)
	sl := slice("dns", nil, ep{addr: "10.0.0.7", ready: true})
	sl.Ports = []discoveryv1.EndpointPort{{Name: &name1, Port: &p, Protocol: &udp}, {Name: &name2, Port: &p, Protocol: &tcp}}
	got := Build([]*corev1.Service{s}, []*discoveryv1.EndpointSlice{sl}, Options{Node: "n1"})
	want := Table{
		{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: ProtoUDP}: {Backends: []Backend{be("10.0.0.7", 5353)}},
		{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: ProtoTCP}: {Backends: []Backend{be("10.0.0.7", 5353)}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Build:\n got %v\nwant %v", got, want)
	}
}

func TestBuildReplacingKubeProxy(t *testing.T) {
	http := corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}
	local := corev1.ServiceInternalTrafficPolicyLocal
	empty := svc("empty", "10.96.0.1", http)
	notReady := svc("notready", "10.96.0.2", http)
	aff := svc("aff", "10.96.0.3", http)
	aff.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	affShort := svc("affshort", "10.96.0.4", http)
	affShort.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	timeout := int32(30)
	affShort.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}
	elsewhere := svc("elsewhere", "10.96.0.5", http)
	elsewhere.Spec.InternalTrafficPolicy = &local
	ext := svc("ext", "", http)
	ext.Spec.Type = corev1.ServiceTypeExternalName
	svcs := []*corev1.Service{empty, notReady, aff, affShort, elsewhere, ext, svc("headless", "None", http)}
	slices := []*discoveryv1.EndpointSlice{
		slice("notready", map[string]int32{"http": 80}, ep{addr: "10.0.0.2"}),
		slice("aff", map[string]int32{"http": 8080}, ep{addr: "10.0.0.3", ready: true}),
		slice("affshort", map[string]int32{"http": 8080}, ep{addr: "10.0.0.4", ready: true}),
		slice("elsewhere", map[string]int32{"http": 80}, ep{addr: "10.0.1.5", ready: true, node: "n2"}),
		slice("headless", map[string]int32{"http": 80}, ep{addr: "10.0.0.6", ready: true}),
	}
	want := Table{
		fe("10.96.0.1", 80): {},
		fe("10.96.0.2", 80): {},
		fe("10.96.0.3", 80): {Backends: []Backend{be("10.0.0.3", 8080)}, AffinityTimeout: 3 * time.Hour},
		fe("10.96.0.4", 80): {Backends: []Backend{be("10.0.0.4", 8080)}, AffinityTimeout: 30 * time.Second},
		fe("10.96.0.5", 80): {},
	}
	got := Build(svcs, slices, Options{Node: "n1", ReplaceKubeProxy: true})
	if len(got) != len(want) {
		t.Fatalf("Build: %d frontends, want %d: %v", len(got), len(want), got)
	}
	for f, w := range want {
		if g, ok := got[f]; !ok || !g.Equal(w) {
			t.Errorf("frontend %v: got %+v (present %v), want %+v", f, g, ok, w)
		}
	}
	// The same cluster beside kube-proxy: only what kube-proxy would not
	// answer differently.
	if got := Build(svcs, slices, Options{Node: "n1"}); len(got) != 0 {
		t.Errorf("beside kube-proxy: got %v, want no frontend", got)
	}
}

func TestEntryEqual(t *testing.T) {
	a := Entry{Backends: []Backend{be("10.0.0.1", 80)}}
	if !a.Equal(Entry{Backends: []Backend{be("10.0.0.1", 80)}}) {
		t.Error("equal entries differ")
	}
	if a.Equal(Entry{Backends: []Backend{be("10.0.0.1", 80)}, AffinityTimeout: time.Second}) {
		t.Error("an affinity timeout makes no difference")
	}
	if a.Equal(Entry{Backends: []Backend{be("10.0.0.1", 81)}}) {
		t.Error("a backend port makes no difference")
	}
}

func TestRemoved(t *testing.T) {
	old := Table{
		fe("10.96.0.1", 80): {Backends: []Backend{be("10.0.0.1", 80), be("10.0.0.2", 80)}},
		fe("10.96.0.2", 80): {Backends: []Backend{be("10.0.0.3", 80)}},
		fe("10.96.0.3", 80): {Backends: []Backend{be("10.0.0.4", 80)}},
		fe("10.96.0.4", 80): {Backends: []Backend{be("10.0.0.5", 80)}},
	}
	new := Table{
		fe("10.96.0.1", 80): {Backends: []Backend{be("10.0.0.2", 80), be("10.0.0.9", 80)}},
		fe("10.96.0.3", 80): {},                                          // no backend left: refuses
		fe("10.96.0.4", 80): {Backends: []Backend{be("10.0.0.5", 8080)}}, // the target port changed
	}
	want := map[Frontend][]Backend{
		fe("10.96.0.1", 80): {be("10.0.0.1", 80)},
		fe("10.96.0.2", 80): {be("10.0.0.3", 80)},
		fe("10.96.0.3", 80): {be("10.0.0.4", 80)},
		fe("10.96.0.4", 80): {be("10.0.0.5", 80)},
	}
	if got := Removed(old, new); !reflect.DeepEqual(got, want) {
		t.Errorf("Removed:\n got %v\nwant %v", got, want)
	}
	if got := Removed(new, new); len(got) != 0 {
		t.Errorf("Removed of an unchanged table: %v, want nothing", got)
	}
}

func TestOwners(t *testing.T) {
	dns := svc("dns", "10.96.0.10",
		corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
		corev1.ServicePort{Name: "dns-tcp", Port: 53})
	got := Owners([]*corev1.Service{dns, svc("headless", "None", corev1.ServicePort{Port: 80})}, Options{})
	want := map[Frontend]string{
		{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: ProtoUDP}: "ns/dns",
		{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: ProtoTCP}: "ns/dns",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Owners:\n got %v\nwant %v", got, want)
	}
}

func TestBuildNodePortsAndExternalAddresses(t *testing.T) {
	local := corev1.ServiceInternalTrafficPolicyLocal
	np := svc("np", "10.96.0.7", corev1.ServicePort{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP})
	np.Spec.Type = corev1.ServiceTypeNodePort
	np.Spec.InternalTrafficPolicy = &local // the ClusterIP's alone
	np.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	np.Spec.ExternalIPs = []string{"192.0.2.10", "2001:db8::1"}
	lb := svc("lb", "10.96.0.8", corev1.ServicePort{Name: "http", Port: 443, NodePort: 30443, Protocol: corev1.ProtocolTCP})
	lb.Spec.Type = corev1.ServiceTypeLoadBalancer
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.5"}, {Hostname: "lb.example"}}
	noNodePort := svc("lb2", "10.96.0.9", corev1.ServicePort{Name: "http", Port: 8443, Protocol: corev1.ProtocolTCP})
	noNodePort.Spec.Type = corev1.ServiceTypeLoadBalancer // allocateLoadBalancerNodePorts: false
	elsewhere := svc("elsewhere", "10.96.0.6", corev1.ServicePort{Name: "http", Port: 80, NodePort: 30081, Protocol: corev1.ProtocolTCP})
	elsewhere.Spec.Type = corev1.ServiceTypeNodePort
	elsewhere.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svcs := []*corev1.Service{np, lb, noNodePort, elsewhere}
	slices := []*discoveryv1.EndpointSlice{
		slice("np", map[string]int32{"http": 8080}, ep{addr: "10.0.0.2", ready: true, node: "n1"}, ep{addr: "10.0.1.2", ready: true, node: "n2"}),
		slice("lb", map[string]int32{"http": 8443}, ep{addr: "10.0.1.3", ready: true, node: "n2"}),
		slice("elsewhere", map[string]int32{"http": 80}, ep{addr: "10.0.1.4", ready: true, node: "n2"}),
	}
	opts := Options{Node: "n1", ReplaceKubeProxy: true, NodeAddrs: []netip.Addr{netip.MustParseAddr("10.99.0.11"), netip.MustParseAddr("10.99.0.12")},
		OwnAddrs: []netip.Addr{netip.MustParseAddr("10.99.0.11")},
		AddrNode: map[netip.Addr]string{netip.MustParseAddr("10.99.0.11"): "n1", netip.MustParseAddr("10.99.0.12"): "n2"}}
	ext := func(ip string, port uint16) Frontend { f := fe(ip, port); f.External = true; return f }
	both := []Backend{be("10.0.0.2", 8080), be("10.0.1.2", 8080)}
	lbBackends := []Backend{be("10.0.1.3", 8443)}
	want := Table{
		fe("10.96.0.7", 80):     {Backends: []Backend{be("10.0.0.2", 8080)}}, // internalTrafficPolicy: Local
		fe("10.99.0.11", 30080): {Backends: both},
		// Another node's externalTrafficPolicy: Local NodePort: served
		// by that node's endpoints, as the packet would be there.
		fe("10.99.0.12", 30080): {Backends: []Backend{be("10.0.1.2", 8080)}},
		fe("127.0.0.1", 30080):  {Backends: both}, // the node's own processes, at localhost
		fe("192.0.2.10", 80):    {Backends: both},
		fe("10.96.0.8", 443):    {Backends: lbBackends},
		fe("0.0.0.0", 30443):    {Backends: lbBackends}, // externalTrafficPolicy: Cluster: one entry for every node's address
		fe("127.0.0.1", 30443):  {Backends: lbBackends},
		fe("198.51.100.5", 443): {Backends: lbBackends},
		fe("10.96.0.9", 8443):   {}, // no endpoints: refuses
		// From outside, to this node: externalTrafficPolicy: Local keeps
		// this node's endpoints, and drops where there are none.
		ext("10.99.0.11", 30080): {Backends: []Backend{be("10.0.0.2", 8080)}},
		ext("192.0.2.10", 80):    {Backends: []Backend{be("10.0.0.2", 8080)}},
		ext("10.99.0.11", 30443): {Backends: lbBackends},
		ext("198.51.100.5", 443): {Backends: lbBackends},
		fe("10.96.0.6", 80):      {Backends: []Backend{be("10.0.1.4", 80)}},
		fe("10.99.0.11", 30081):  {Backends: []Backend{be("10.0.1.4", 80)}},
		fe("10.99.0.12", 30081):  {Backends: []Backend{be("10.0.1.4", 80)}},
		fe("127.0.0.1", 30081):   {Backends: []Backend{be("10.0.1.4", 80)}},
		ext("10.99.0.11", 30081): {DropWhenEmpty: true},
	}
	got := Build(svcs, slices, opts)
	if len(got) != len(want) {
		t.Fatalf("Build: %d frontends, want %d:\n got %v\nwant %v", len(got), len(want), got, want)
	}
	for f, w := range want {
		if g, ok := got[f]; !ok || !g.Equal(w) {
			t.Errorf("frontend %v: got %+v (present %v), want %+v", f, g, ok, w)
		}
	}
	owners := Owners(svcs, opts)
	if owners[fe("0.0.0.0", 30443)] != "ns/lb" || owners[fe("198.51.100.5", 443)] != "ns/lb" || len(owners) != len(want) {
		t.Errorf("Owners: %v", owners)
	}
	// Beside kube-proxy only the ClusterIPs with backends are Weir's.
	opts.ReplaceKubeProxy = false
	if got := Build(svcs, slices, opts); len(got) != 3 {
		t.Errorf("beside kube-proxy: %v, want the three ClusterIPs with backends", got)
	}
}

func TestHealthChecks(t *testing.T) {
	http := corev1.ServicePort{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}
	lb := func(name string, hc int32, policy corev1.ServiceExternalTrafficPolicy) *corev1.Service {
		s := svc(name, "10.96.0.9", http)
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = policy
		s.Spec.HealthCheckNodePort = hc
		return s
	}
	local := corev1.ServiceExternalTrafficPolicyLocal
	svcs := []*corev1.Service{
		lb("here", 32001, local), lb("elsewhere", 32002, local), lb("cluster", 32003, corev1.ServiceExternalTrafficPolicyCluster),
	}
	slices := []*discoveryv1.EndpointSlice{
		slice("here", map[string]int32{"http": 80}, ep{addr: "10.0.0.2", ready: true, node: "n1"}, ep{addr: "10.0.0.3", ready: true, node: "n1"},
			ep{addr: "10.0.0.4", node: "n1"}, ep{addr: "10.0.1.2", ready: true, node: "n2"}),
		slice("elsewhere", map[string]int32{"http": 80}, ep{addr: "10.0.1.3", ready: true, node: "n2"}),
	}
	want := map[uint16]HealthCheck{
		32001: {Namespace: "ns", Name: "here", LocalEndpoints: 2},
		32002: {Namespace: "ns", Name: "elsewhere"},
	}
	if got := HealthChecks(svcs, slices, "n1"); !reflect.DeepEqual(got, want) {
		t.Errorf("HealthChecks:\n got %v\nwant %v", got, want)
	}
}

// TestBuildKeepsReservedPortsFree: an external IP on the overlay's UDP
// port would capture the cluster's tunnel traffic: it is left out, and its
// ClusterIP served.
func TestBuildKeepsReservedPortsFree(t *testing.T) {
	vx := svc("vx", "10.96.0.5", corev1.ServicePort{Name: "vx", Port: 4789, Protocol: corev1.ProtocolUDP})
	vx.Spec.ExternalIPs = []string{"10.99.0.11"}
	sl := slice("vx", nil, ep{addr: "10.0.0.2", ready: true})
	name, udp, p := "vx", corev1.ProtocolUDP, int32(4789)
	sl.Ports = []discoveryv1.EndpointPort{{Name: &name, Port: &p, Protocol: &udp}}
	got := Build([]*corev1.Service{vx}, []*discoveryv1.EndpointSlice{sl},
		Options{Node: "n1", ReplaceKubeProxy: true, OwnAddrs: []netip.Addr{netip.MustParseAddr("10.99.0.11")},
			Reserved: []PortProto{{Port: 4789, Proto: ProtoUDP}}})
	if len(got) != 1 {
		t.Errorf("Build: %v, want the ClusterIP alone", got)
	}
}

// TestBuildCollisionsAreDeterministic: an externalIP set to another
// Service's ClusterIP never takes that ClusterIP, whatever order the
// Services are listed in.
func TestBuildCollisionsAreDeterministic(t *testing.T) {
	dns := svc("kube-dns", "10.96.0.10", corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP})
	thief := svc("thief", "10.96.0.99", corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP})
	thief.Spec.ExternalIPs = []string{"10.96.0.10"}
	udp, p53 := corev1.ProtocolUDP, int32(53)
	name := "dns"
	mk := func(svcName, addr string) *discoveryv1.EndpointSlice {
		s := slice(svcName, nil, ep{addr: addr, ready: true})
		s.Ports = []discoveryv1.EndpointPort{{Name: &name, Port: &p53, Protocol: &udp}}
		return s
	}
	slices := []*discoveryv1.EndpointSlice{mk("kube-dns", "10.0.0.53"), mk("thief", "10.0.0.66")}
	dnsFE := Frontend{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: ProtoUDP}
	for _, order := range [][]*corev1.Service{{dns, thief}, {thief, dns}} {
		got := Build(order, slices, Options{Node: "n1", ReplaceKubeProxy: true})
		if !got[dnsFE].Equal(Entry{Backends: []Backend{be("10.0.0.53", 53)}}) {
			t.Errorf("order %s first: kube-dns's ClusterIP goes to %v", order[0].Name, got[dnsFE])
		}
		if o := Owners(order, Options{Node: "n1", ReplaceKubeProxy: true})[dnsFE]; o != "ns/kube-dns" {
			t.Errorf("order %s first: the ClusterIP is named %q", order[0].Name, o)
		}
	}
}

// TestBuildFollowsTopologyHints: trafficDistribution's hints narrow a
// ClusterIP's backends as kube-proxy narrows them: to the endpoints hinted
// for this node, else for its zone, and to all of them when any endpoint
// lacks hints or none is hinted for this node or zone;
// internalTrafficPolicy: Local and terminating endpoints ignore hints.
func TestBuildFollowsTopologyHints(t *testing.T) {
	web := svc("web", "10.96.0.5", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	a1 := ep{addr: "10.0.0.1", ready: true, node: "n1", forZones: []string{"a"}}
	a2 := ep{addr: "10.0.0.2", ready: true, node: "n2", forZones: []string{"a"}}
	b3 := ep{addr: "10.0.1.3", ready: true, node: "n3", forZones: []string{"b"}}
	all := []Backend{be("10.0.0.1", 8080), be("10.0.0.2", 8080), be("10.0.1.3", 8080)}
	tests := []struct {
		name       string
		node, zone string
		eps        []ep
		want       []Backend
	}{
		{"this zone's endpoints", "n1", "a", []ep{a1, a2, b3}, all[:2]},
		{"the other zone's", "n3", "b", []ep{a1, a2, b3}, all[2:]},
		{"no endpoint hinted for this zone: all", "n4", "c", []ep{a1, a2, b3}, all},
		{"a node without a zone: all", "n1", "", []ep{a1, a2, b3}, all},
		{"one endpoint without hints: all", "n1", "a", []ep{a1, a2, {addr: "10.0.1.3", ready: true, node: "n3"}}, all},
		{"hints for this node first (PreferSameNode)", "n2", "a", []ep{
			{addr: "10.0.0.1", ready: true, node: "n1", forZones: []string{"a"}, forNodes: []string{"n1"}},
			{addr: "10.0.0.2", ready: true, node: "n2", forZones: []string{"a"}, forNodes: []string{"n2"}},
			{addr: "10.0.1.3", ready: true, node: "n3", forZones: []string{"b"}, forNodes: []string{"n3"}},
		}, all[1:2]},
		{"node hints naming no endpoint here: the zone's", "n4", "a", []ep{
			{addr: "10.0.0.1", ready: true, node: "n1", forZones: []string{"a"}, forNodes: []string{"n1"}},
			{addr: "10.0.0.2", ready: true, node: "n2", forZones: []string{"a"}, forNodes: []string{"n2"}},
			{addr: "10.0.1.3", ready: true, node: "n3", forZones: []string{"b"}, forNodes: []string{"n3"}},
		}, all[:2]},
		{"terminating endpoints when none is ready: hints ignored", "n3", "b", []ep{
			{addr: "10.0.0.1", terminated: true, node: "n1", forZones: []string{"a"}},
			{addr: "10.0.0.2", terminated: true, node: "n2", forZones: []string{"a"}},
		}, all[:2]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Build([]*corev1.Service{web}, []*discoveryv1.EndpointSlice{slice("web", map[string]int32{"http": 8080}, tt.eps...)},
				Options{Node: tt.node, Zone: tt.zone})
			if e := got[fe("10.96.0.5", 80)]; !reflect.DeepEqual(e.Backends, tt.want) {
				t.Errorf("backends %v, want %v", e.Backends, tt.want)
			}
		})
	}

	local := corev1.ServiceInternalTrafficPolicyLocal
	web.Spec.InternalTrafficPolicy = &local
	got := Build([]*corev1.Service{web}, []*discoveryv1.EndpointSlice{slice("web", map[string]int32{"http": 8080}, a1, a2, b3)},
		Options{Node: "n3", Zone: "a"})
	if e := got[fe("10.96.0.5", 80)]; !reflect.DeepEqual(e.Backends, all[2:]) {
		t.Errorf("internalTrafficPolicy: Local: %v, want this node's endpoint alone, hints ignored", e.Backends)
	}
}

// TestBuildOtherNodesLocalNodePort: a socket naming another node's
// externalTrafficPolicy: Local NodePort goes to that node's endpoints
// alone, and with none there it is not translated at all (the packet goes
// to that node, which drops it), while this node's own NodePort keeps
// every endpoint for its own clients.
func TestBuildOtherNodesLocalNodePort(t *testing.T) {
	np := svc("np", "10.96.0.7", corev1.ServicePort{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP})
	np.Spec.Type = corev1.ServiceTypeNodePort
	np.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	n1, n2 := netip.MustParseAddr("10.99.0.11"), netip.MustParseAddr("10.99.0.12")
	opts := Options{Node: "n1", ReplaceKubeProxy: true, NodeAddrs: []netip.Addr{n1, n2}, OwnAddrs: []netip.Addr{n1},
		AddrNode: map[netip.Addr]string{n1: "n1", n2: "n2"}}
	onN1 := slice("np", map[string]int32{"http": 8080}, ep{addr: "10.0.0.2", ready: true, node: "n1"})
	got := Build([]*corev1.Service{np}, []*discoveryv1.EndpointSlice{onN1}, opts)
	if e, ok := got[fe("10.99.0.12", 30080)]; ok {
		t.Errorf("n2's NodePort with no endpoint on n2: %v, want no frontend (left for n2 to drop)", e)
	}
	if e := got[fe("10.99.0.11", 30080)]; !reflect.DeepEqual(e.Backends, []Backend{be("10.0.0.2", 8080)}) {
		t.Errorf("this node's NodePort: %v, want its endpoint", e.Backends)
	}
	opts.Node, opts.OwnAddrs = "n2", []netip.Addr{n2}
	got = Build([]*corev1.Service{np}, []*discoveryv1.EndpointSlice{onN1}, opts)
	if e := got[fe("10.99.0.11", 30080)]; !reflect.DeepEqual(e.Backends, []Backend{be("10.0.0.2", 8080)}) {
		t.Errorf("from n2, n1's NodePort: %v, want n1's endpoint", e.Backends)
	}
	if e, ok := got[fe("10.99.0.12", 30080)]; !ok || !reflect.DeepEqual(e.Backends, []Backend{be("10.0.0.2", 8080)}) {
		t.Errorf("from n2, its own NodePort: %v (present %v), want every endpoint, as kube-proxy serves its own node's clients", e.Backends, ok)
	}
}

// TestBuildLeavesOtherProxiesAndHeadlessSlices: as kube-proxy's informers
// select, a Service naming another proxy (service-proxy-name) is not
// served at all, and an EndpointSlice labelled headless or naming another
// proxy gives no backends: with no other slice the Service refuses (no
// kube-proxy beside Weir) or is left alone (beside it). Health check node
// ports and owners follow.
func TestBuildLeavesOtherProxiesAndHeadlessSlices(t *testing.T) {
	web := svc("web", "10.96.0.5", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	other := svc("other", "10.96.0.6", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	other.Labels = map[string]string{LabelServiceProxyName: "foo-bar"}
	other.Spec.Type, other.Spec.ExternalTrafficPolicy, other.Spec.HealthCheckNodePort = corev1.ServiceTypeLoadBalancer, corev1.ServiceExternalTrafficPolicyLocal, 32000
	webSlice := slice("web", map[string]int32{"http": 8080}, ep{addr: "10.0.0.2", ready: true, node: "n1"})
	otherSlice := slice("other", map[string]int32{"http": 8080}, ep{addr: "10.0.0.3", ready: true, node: "n1"})
	svcs, slices := []*corev1.Service{web, other}, []*discoveryv1.EndpointSlice{webSlice, otherSlice}

	opts := Options{Node: "n1", ReplaceKubeProxy: true}
	got := Build(svcs, slices, opts)
	if e, ok := got[fe("10.96.0.5", 80)]; !ok || len(e.Backends) != 1 {
		t.Errorf("web: %v (present %v), want its backend", e, ok)
	}
	if e, ok := got[fe("10.96.0.6", 80)]; ok {
		t.Errorf("a Service for another proxy is served: %v", e)
	}
	if _, ok := Owners(svcs, opts)[fe("10.96.0.6", 80)]; ok {
		t.Error("a Service for another proxy owns a frontend")
	}
	if hc := HealthChecks(svcs, slices, "n1"); len(hc) != 0 {
		t.Errorf("health checks %v, want none for another proxy's Service", hc)
	}

	for _, label := range []string{corev1.IsHeadlessService, LabelServiceProxyName} {
		webSlice.Labels[label] = ""
		got = Build(svcs, slices, opts)
		if e, ok := got[fe("10.96.0.5", 80)]; !ok || len(e.Backends) != 0 {
			t.Errorf("slice labelled %s: %v (present %v), want the frontend refusing, without backends", label, e, ok)
		}
		if _, ok := Build(svcs, slices, Options{Node: "n1"})[fe("10.96.0.5", 80)]; ok {
			t.Errorf("slice labelled %s, beside kube-proxy: translated, want left alone", label)
		}
		delete(webSlice.Labels, label)
	}
}

// TestNodePortFrontendsDoNotGrowWithNodes: in a cluster of 500 nodes an
// externalTrafficPolicy: Cluster NodePort has one socket frontend for
// every node's address (AnyNode) beside its ClusterIP and localhost, and
// one for packets from outside at this node's address; a Local one keeps
// one per node address, another node's serving that node's endpoints.
func TestNodePortFrontendsDoNotGrowWithNodes(t *testing.T) {
	opts := Options{Node: "n0", ReplaceKubeProxy: true, AddrNode: map[netip.Addr]string{}}
	for i := range 500 {
		a := netip.AddrFrom4([4]byte{10, 99, byte(i >> 8), byte(i)})
		opts.NodeAddrs = append(opts.NodeAddrs, a)
		opts.AddrNode[a] = fmt.Sprintf("n%d", i)
	}
	opts.OwnAddrs = opts.NodeAddrs[:1]
	np := svc("np", "10.96.0.7", corev1.ServicePort{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP})
	np.Spec.Type = corev1.ServiceTypeNodePort
	eps := slice("np", map[string]int32{"http": 8080}, ep{addr: "10.0.0.2", ready: true, node: "n0"}, ep{addr: "10.0.1.2", ready: true, node: "n1"})
	got := Build([]*corev1.Service{np}, []*discoveryv1.EndpointSlice{eps}, opts)
	anyNode := Frontend{Addr: AnyNode, Port: 30080, Proto: ProtoTCP}
	if len(got) != 4 || len(got[anyNode].Backends) != 2 {
		t.Errorf("Cluster NodePort among 500 nodes: %d frontends (any node: %v), want 4 with both backends at any node", len(got), got[anyNode])
	}
	np.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	got = Build([]*corev1.Service{np}, []*discoveryv1.EndpointSlice{eps}, opts)
	n1 := Frontend{Addr: opts.NodeAddrs[1], Port: 30080, Proto: ProtoTCP}
	// ClusterIP, this node's and n1's address (the others have no
	// endpoint: left out, to drop there), localhost, from outside.
	if len(got) != 5 || !got[n1].Equal(Entry{Backends: []Backend{be("10.0.1.2", 8080)}}) {
		t.Errorf("Local NodePort: %d frontends, n1's %v; want 5, n1's own endpoint", len(got), got[n1])
	}
}

package policy

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var update = flag.Bool("update", false, "rewrite golden files")

// fixture: namespaces x and y; x/a (app=a, local), x/b (app=b, local),
// y/a (app=a, remote).
func fixture(policies ...*networkingv1.NetworkPolicy) *Snapshot {
	s := &Snapshot{
		Namespaces: map[string]Namespace{
			"x": {Name: "x", Labels: map[string]string{"kubernetes.io/metadata.name": "x", "team": "blue"}},
			"y": {Name: "y", Labels: map[string]string{"kubernetes.io/metadata.name": "y", "team": "red"}},
		},
		Pods: []Pod{
			{Namespace: "x", Name: "a", Labels: map[string]string{"app": "a"}, IPs: addrs("10.0.0.1"), Local: true,
				Ports: []NamedPort{{Name: "http", Port: 8080, Protocol: ProtoTCP}}},
			{Namespace: "x", Name: "b", Labels: map[string]string{"app": "b"}, IPs: addrs("10.0.0.2"), Local: true,
				Ports: []NamedPort{{Name: "http", Port: 9090, Protocol: ProtoTCP}}},
			{Namespace: "y", Name: "a", Labels: map[string]string{"app": "a"}, IPs: addrs("10.0.1.1")},
		},
		Policies:      policies,
		Identities:    map[string]Identity{},
		HostIPs:       addrs("192.168.0.1"),
		RemoteNodeIPs: addrs("192.168.0.2"),
	}
	for i, p := range s.Pods {
		s.Identities[IdentityLabels(s.namespace(p.Namespace), p.Labels).Key()] = MinClusterIdentity + Identity(i)
	}
	return s
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func np(ns, name string, sel map[string]string, types []string, spec func(*networkingv1.NetworkPolicySpec)) *networkingv1.NetworkPolicy {
	p := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	p.Spec.PodSelector = metav1.LabelSelector{MatchLabels: sel}
	for _, t := range types {
		p.Spec.PolicyTypes = append(p.Spec.PolicyTypes, networkingv1.PolicyType(t))
	}
	if spec != nil {
		spec(&p.Spec)
	}
	return p
}

func tcp(port int) networkingv1.NetworkPolicyPort {
	v := intstr.FromInt32(int32(port))
	return networkingv1.NetworkPolicyPort{Port: &v}
}

func named(name string) networkingv1.NetworkPolicyPort {
	v := intstr.FromString(name)
	return networkingv1.NetworkPolicyPort{Port: &v}
}

func podPeer(sel map[string]string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: sel}}
}

func nsPeer(sel map[string]string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: sel}}
}

type probe struct {
	pod   string
	dir   Direction
	peer  string
	proto uint8
	port  uint16
	allow bool
}

func TestCompileSemantics(t *testing.T) {
	allIngress := func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{}}
	}
	tests := []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		probes   []probe
	}{
		{"no policy allows everything", nil, []probe{
			{"x/a", Ingress, "10.0.1.1", ProtoTCP, 80, true},
			{"x/a", Egress, "172.16.0.1", ProtoUDP, 53, true},
		}},
		{"default deny ingress keeps egress and ingress from the node", []*networkingv1.NetworkPolicy{
			np("x", "deny", nil, []string{"Ingress"}, nil)}, []probe{
			{"x/a", Ingress, "10.0.0.2", ProtoTCP, 80, false},
			{"x/a", Ingress, "192.168.0.2", ProtoTCP, 80, false}, // another node is not exempt
			{"x/a", Ingress, "192.168.0.1", ProtoTCP, 80, true},  // its own node is
			{"x/a", Egress, "10.0.1.1", ProtoTCP, 80, true},
		}},
		{"default deny egress denies the pod's own node", []*networkingv1.NetworkPolicy{
			np("x", "deny", nil, []string{"Egress"}, nil)}, []probe{
			{"x/a", Egress, "192.168.0.1", ProtoTCP, 10250, false}, // kubelet
			{"x/a", Egress, "192.168.0.1", ProtoTCP, 9880, false},  // agent metrics
			{"x/a", Egress, "192.168.0.1", ProtoTCP, 30080, false}, // a NodePort
			{"x/a", Egress, "192.168.0.1", 1, 0, false},
			{"x/a", Egress, "192.168.0.2", ProtoTCP, 10250, false},
		}},
		{"default deny both ways: ingress from the node stays allowed, egress to it does not", []*networkingv1.NetworkPolicy{
			np("x", "deny", nil, []string{"Ingress", "Egress"}, nil)}, []probe{
			{"x/a", Ingress, "192.168.0.1", ProtoTCP, 8080, true},
			{"x/a", Ingress, "192.168.0.1", 1, 0, true},
			{"x/a", Egress, "192.168.0.1", ProtoTCP, 10250, false},
			{"x/b", Ingress, "192.168.0.1", ProtoTCP, 9090, true},
			{"x/b", Egress, "192.168.0.1", ProtoTCP, 10250, false},
		}},
		{"egress ipBlock over the node's address allows the node", []*networkingv1.NetworkPolicy{
			np("x", "to-nodes", nil, []string{"Egress"}, func(s *networkingv1.NetworkPolicySpec) {
				s.Egress = []networkingv1.NetworkPolicyEgressRule{{
					To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "192.168.0.0/24"}}},
					Ports: []networkingv1.NetworkPolicyPort{tcp(10250)}}}
			})}, []probe{
			{"x/a", Egress, "192.168.0.1", ProtoTCP, 10250, true},
			{"x/a", Egress, "192.168.0.1", ProtoTCP, 9880, false}, // only the port the rule names
			{"x/a", Egress, "192.168.0.2", ProtoTCP, 10250, true},
			{"x/a", Egress, "10.0.0.2", ProtoTCP, 10250, false},
		}},
		{"an ipBlock except carves the pod's own node out", []*networkingv1.NetworkPolicy{
			np("x", "not-my-node", nil, []string{"Egress"}, func(s *networkingv1.NetworkPolicySpec) {
				s.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{
					IPBlock: &networkingv1.IPBlock{CIDR: "192.168.0.0/16", Except: []string{"192.168.0.1/32"}}}}}}
			})}, []probe{
			{"x/a", Egress, "192.168.0.1", ProtoTCP, 10250, false},
			{"x/a", Egress, "192.168.0.2", ProtoTCP, 10250, true},
		}},
		{"an empty rule allows all, ICMP too", []*networkingv1.NetworkPolicy{
			np("x", "all", nil, []string{"Ingress"}, allIngress)}, []probe{
			{"x/a", Ingress, "172.16.0.1", 1, 0, true},
		}},
		{"default deny egress from policyTypes alone", []*networkingv1.NetworkPolicy{
			np("x", "deny", map[string]string{"app": "a"}, []string{"Egress"}, nil)}, []probe{
			{"x/a", Egress, "10.0.0.2", ProtoTCP, 80, false},
			{"x/b", Egress, "10.0.0.1", ProtoTCP, 80, true},
			{"x/a", Ingress, "10.0.0.2", ProtoTCP, 80, true},
		}},
		{"policyTypes absent: egress rules make it egress too", []*networkingv1.NetworkPolicy{
			np("x", "p", nil, nil, func(s *networkingv1.NetworkPolicySpec) {
				s.Egress = []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(53)}}}
			})}, []probe{
			{"x/a", Ingress, "10.0.0.2", ProtoTCP, 80, false},
			{"x/a", Egress, "10.0.1.1", ProtoTCP, 53, true},
			{"x/a", Egress, "10.0.1.1", ProtoUDP, 53, false}, // protocol defaults to TCP
		}},
		{"podSelector alone means the policy's namespace", []*networkingv1.NetworkPolicy{
			np("x", "p", nil, nil, func(s *networkingv1.NetworkPolicySpec) {
				s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{podPeer(map[string]string{"app": "a"})}}}
			})}, []probe{
			{"x/b", Ingress, "10.0.0.1", ProtoTCP, 80, true},
			{"x/b", Ingress, "10.0.1.1", ProtoTCP, 80, false},
		}},
		{"namespaceSelector and podSelector in one peer are ANDed", []*networkingv1.NetworkPolicy{
			np("x", "p", nil, nil, func(s *networkingv1.NetworkPolicySpec) {
				peer := nsPeer(map[string]string{"team": "red"})
				peer.PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "b"}}
				s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{peer}}}
			})}, []probe{
			{"x/a", Ingress, "10.0.1.1", ProtoTCP, 80, false},
			{"x/a", Ingress, "10.0.0.2", ProtoTCP, 80, false},
		}},
		{"two peers are ORed", []*networkingv1.NetworkPolicy{
			np("x", "p", nil, nil, func(s *networkingv1.NetworkPolicySpec) {
				s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
					nsPeer(map[string]string{"team": "red"}), podPeer(map[string]string{"app": "b"})}}}
			})}, []probe{
			{"x/a", Ingress, "10.0.1.1", ProtoTCP, 80, true},
			{"x/a", Ingress, "10.0.0.2", ProtoTCP, 80, true},
			{"x/b", Ingress, "10.0.0.1", ProtoTCP, 80, false},
		}},
		{"ipBlock with except matches pod addresses too", []*networkingv1.NetworkPolicy{
			np("x", "p", nil, []string{"Egress"}, func(s *networkingv1.NetworkPolicySpec) {
				s.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{
					IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{"10.0.1.0/24"}}}}}}
			})}, []probe{
			{"x/a", Egress, "10.0.0.2", ProtoTCP, 80, true},
			{"x/a", Egress, "10.0.1.1", ProtoTCP, 80, false},
			{"x/a", Egress, "10.0.200.9", ProtoUDP, 9, true},
			{"x/a", Egress, "172.16.0.1", ProtoTCP, 80, false},
		}},
		{"endPort ranges and SCTP", []*networkingv1.NetworkPolicy{
			np("x", "p", nil, []string{"Ingress"}, func(s *networkingv1.NetworkPolicySpec) {
				r := tcp(1000)
				end := int32(2000)
				r.EndPort = &end
				sctp := tcp(80)
				proto := corev1.ProtocolSCTP
				sctp.Protocol = &proto
				s.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{r, sctp}}}
			})}, []probe{
			{"x/a", Ingress, "10.0.1.1", ProtoTCP, 999, false},
			{"x/a", Ingress, "10.0.1.1", ProtoTCP, 1000, true},
			{"x/a", Ingress, "10.0.1.1", ProtoTCP, 2000, true},
			{"x/a", Ingress, "10.0.1.1", ProtoTCP, 2001, false},
			{"x/a", Ingress, "10.0.1.1", ProtoSCTP, 80, true},
			{"x/a", Ingress, "10.0.1.1", ProtoTCP, 80, false},
		}},
		{"ingress named port resolves on each target pod", []*networkingv1.NetworkPolicy{
			np("x", "p", nil, []string{"Ingress"}, func(s *networkingv1.NetworkPolicySpec) {
				s.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{named("http")}}}
			})}, []probe{
			{"x/a", Ingress, "10.0.1.1", ProtoTCP, 8080, true},
			{"x/a", Ingress, "10.0.1.1", ProtoTCP, 9090, false},
			{"x/b", Ingress, "10.0.1.1", ProtoTCP, 9090, true},
		}},
		{"egress named port resolves on the destination pod", []*networkingv1.NetworkPolicy{
			np("x", "p", map[string]string{"app": "a"}, []string{"Egress"}, func(s *networkingv1.NetworkPolicySpec) {
				s.Egress = []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{named("http")}}}
			})}, []probe{
			{"x/a", Egress, "10.0.0.2", ProtoTCP, 9090, true},
			{"x/a", Egress, "10.0.0.2", ProtoTCP, 8080, false},
			{"x/a", Egress, "172.16.0.1", ProtoTCP, 9090, false}, // not a pod: no named ports
		}},
		{"policies add up", []*networkingv1.NetworkPolicy{
			np("x", "deny", nil, []string{"Ingress"}, nil),
			np("x", "web", map[string]string{"app": "a"}, nil, func(s *networkingv1.NetworkPolicySpec) {
				s.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(80)}}}
			})}, []probe{
			{"x/a", Ingress, "10.0.1.1", ProtoTCP, 80, true},
			{"x/b", Ingress, "10.0.1.1", ProtoTCP, 80, false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := fixture(tt.policies...)
			res := NewCompiler().Compile(s)
			if len(res.Errors) > 0 {
				t.Fatalf("errors: %v", res.Errors)
			}
			for _, p := range tt.probes {
				dec := res.Lookup(p.pod, p.dir, netip.MustParseAddr(p.peer), p.proto, p.port)
				if dec.Allowed() != p.allow {
					t.Errorf("%s %s %s %s/%d: allowed=%v (rule %v), want %v", p.pod, p.dir, p.peer,
						ProtoName(p.proto), p.port, dec.Allowed(), res.Rules[dec.Rule], p.allow)
				}
			}
			if err := checkPodsAgainstEvaluate(s, res, tt.probes); err != nil {
				t.Error(err)
			}
		})
	}
}

func checkPodsAgainstEvaluate(s *Snapshot, res *Result, probes []probe) error {
	for _, p := range probes {
		for i := range s.Pods {
			if s.Pods[i].Key() != p.pod {
				continue
			}
			want := Evaluate(s, &s.Pods[i], p.dir, netip.MustParseAddr(p.peer), p.proto, p.port)
			if (want.Verdict == VerdictAllow) != p.allow {
				return fmt.Errorf("Evaluate disagrees with the table on %+v", p)
			}
		}
	}
	return nil
}

func TestInvalidPolicyFailsClosed(t *testing.T) {
	bad := np("x", "bad", nil, []string{"Ingress"}, func(s *networkingv1.NetworkPolicySpec) {
		p := tcp(80)
		icmp := corev1.Protocol("ICMP")
		p.Protocol = &icmp
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{p}}}
	})
	res := NewCompiler().Compile(fixture(bad))
	if len(res.Errors) != 1 || !errors.Is(res.Errors[0], ErrUnsupportedProtocol) {
		t.Fatalf("errors = %v, want one ErrUnsupportedProtocol", res.Errors)
	}
	if !strings.Contains(res.Errors[0].Error(), "networkpolicy x/bad: ingress[0]") {
		t.Errorf("error does not name the rule: %v", res.Errors[0])
	}
	if res.Lookup("x/a", Ingress, netip.MustParseAddr("10.0.1.1"), ProtoTCP, 80).Allowed() {
		t.Error("a policy that failed to compile let traffic in")
	}
}

func TestUnallocatedIdentityIsWorld(t *testing.T) {
	s := fixture(np("x", "p", nil, []string{"Ingress"}, func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
			nsPeer(map[string]string{"team": "red"})}}}
	}))
	yKey := IdentityLabels(s.namespace("y"), map[string]string{"app": "a"}).Key()
	delete(s.Identities, yKey)
	res := NewCompiler().Compile(s)
	if len(res.Unallocated) != 1 || res.Unallocated[0] != yKey {
		t.Fatalf("Unallocated = %q, want [%q]", res.Unallocated, yKey)
	}
	if res.Lookup("x/a", Ingress, netip.MustParseAddr("10.0.1.1"), ProtoTCP, 80).Allowed() {
		t.Error("a pod without identity was allowed before it had one")
	}
}

func TestRuleIDsStable(t *testing.T) {
	c := NewCompiler()
	p1 := np("x", "one", nil, nil, func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(80)}}}
	})
	p2 := np("x", "two", nil, nil, func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{tcp(81)}}}
	})
	first := c.Compile(fixture(p1, p2))
	second := c.Compile(fixture(p2, p1)) // order of the input does not matter
	if d := DiffResults(first, second); !d.Empty() {
		t.Fatalf("reordered policies changed the state: %+v", d)
	}
	third := c.Compile(fixture(p2))
	d := DiffResults(second, third)
	for _, ed := range d.Endpoints {
		if len(ed.Upsert) != 0 || len(ed.Delete) != 1 {
			t.Errorf("removing one single-port rule: %s upserts %v deletes %v", ed.Pod, ed.Upsert, ed.Delete)
		}
	}
}

func TestSelectorCacheSharesSelectors(t *testing.T) {
	var ps []*networkingv1.NetworkPolicy
	for i := 0; i < 50; i++ {
		ps = append(ps, np("x", fmt.Sprintf("p%d", i), nil, nil, func(s *networkingv1.NetworkPolicySpec) {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				nsPeer(map[string]string{"team": "red"})}, Ports: []networkingv1.NetworkPolicyPort{tcp(1000 + i)}}}
		}))
	}
	cp := &compilation{s: fixture(ps...), c: NewCompiler(), res: &Result{Endpoints: map[string]*EndpointPolicy{},
		IPCache: map[netip.Addr]Identity{}, CIDRs: map[netip.Prefix]Identity{}, Rules: map[RuleID]RuleRef{}},
		usedCIDR: map[netip.Prefix]bool{}, usedRule: map[RuleRef]bool{}}
	cp.buildLabelSets()
	cp.buildCIDRs()
	cp.buildEndpoints()
	for _, p := range ps {
		if err := cp.applyPolicy(p); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(cp.selector.cache); n != 1 {
		t.Errorf("%d selector evaluations for one distinct selector", n)
	}
}

func TestRangePrefixes(t *testing.T) {
	for _, r := range [][2]uint16{{0, 65535}, {1, 65535}, {80, 80}, {79, 81}, {1000, 2000}, {1024, 2047}, {65535, 65535}, {0, 0}} {
		ps := RangePrefixes(r[0], r[1])
		if len(ps) > 30 {
			t.Errorf("%v: %d prefixes", r, len(ps))
		}
		for port := 0; port <= 65535; port++ {
			in := uint16(port) >= r[0] && uint16(port) <= r[1]
			n := 0
			for _, p := range ps {
				if p.Contains(uint16(port)) {
					n++
				}
			}
			if (in && n != 1) || (!in && n != 0) {
				t.Fatalf("%v: port %d covered %d times", r, port, n)
			}
		}
	}
}

func TestCandidateIdentity(t *testing.T) {
	seen := map[Identity]bool{}
	for attempt := 0; attempt < 10; attempt++ {
		id := CandidateIdentity("k8s:app=a", attempt)
		if id < MinClusterIdentity || id > MaxClusterIdentity || seen[id] {
			t.Fatalf("attempt %d: %d out of range or repeated", attempt, id)
		}
		seen[id] = true
	}
	if CandidateIdentity("k8s:app=a", 0) != CandidateIdentity("k8s:app=a", 0) {
		t.Fatal("not deterministic")
	}
}

// TestGolden pins the compiled form of a small scenario, so a change in
// the key layout or numbering shows up in review. go test -update rewrites.
func TestGolden(t *testing.T) {
	s := fixture(
		np("x", "deny", nil, []string{"Ingress", "Egress"}, nil),
		np("x", "web", map[string]string{"app": "a"}, nil, func(s *networkingv1.NetworkPolicySpec) {
			r := tcp(8000)
			end := int32(8100)
			r.EndPort = &end
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{nsPeer(map[string]string{"team": "red"}), {IPBlock: &networkingv1.IPBlock{CIDR: "172.16.0.0/12", Except: []string{"172.16.1.0/24"}}}},
				Ports: []networkingv1.NetworkPolicyPort{named("http"), r},
			}}
			s.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{podPeer(map[string]string{"app": "b"})}}}
		}),
	)
	got := dumpResult(NewCompiler().Compile(s))
	path := filepath.Join("testdata", "golden.txt")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("compiled state differs from %s (go test -update rewrites it):\n%s", path, got)
	}
}

func dumpResult(r *Result) string {
	var b strings.Builder
	var lines []string
	for a, id := range r.IPCache {
		lines = append(lines, fmt.Sprintf("ipcache %s -> %d", a, id))
	}
	for p, id := range r.CIDRs {
		lines = append(lines, fmt.Sprintf("cidr %s -> %d", p, id))
	}
	sort.Strings(lines)
	b.WriteString(strings.Join(lines, "\n") + "\n")
	pods := make([]string, 0, len(r.Endpoints))
	for p := range r.Endpoints {
		pods = append(pods, p)
	}
	sort.Strings(pods)
	for _, p := range pods {
		ep := r.Endpoints[p]
		fmt.Fprintf(&b, "endpoint %s identity=%d enforced ingress=%v egress=%v\n", p, ep.Identity, ep.Enforced[Ingress], ep.Enforced[Egress])
		var keys []string
		for k, e := range ep.Entries {
			keys = append(keys, "  "+dumpEntry(k, e, r.Rules))
		}
		sort.Strings(keys)
		b.WriteString(strings.Join(keys, "\n") + "\n")
	}
	return b.String()
}

// dumpEntry prints a key and what it holds; a NetworkPolicy-only entry
// prints as it did before cluster policies existed.
func dumpEntry(k Key, e Entry, rules map[RuleID]RuleRef) string {
	out := k.String() + " ->"
	if e.Allow != 0 {
		out += " " + rules[e.Allow].String()
	}
	for t := range e.Tier {
		for _, m := range []Match{e.Tier[t], e.Log[t]} {
			if m.Found() {
				out += fmt.Sprintf(" | #%d %s", m.Rank, rules[m.Rule])
			}
		}
	}
	return out
}

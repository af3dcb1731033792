package policy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weirnet/weir/internal/l7"
)

// httpReq parses one request for a test.
func httpReq(t testing.TB, method, path string, header ...string) *l7.Request {
	t.Helper()
	head := method + " " + path + " HTTP/1.1\r\nHost: web\r\n" + strings.Join(append(header, ""), "\r\n") + "\r\n"
	rs, err := l7.NewParser(l7.Limits{}).Feed([]byte(head))
	if err != nil || len(rs) != 1 {
		t.Fatalf("parse %q: %v", head, err)
	}
	return rs[0]
}

// genHTTPVocabulary are the HTTP rules and requests of the generated
// clusters: small enough that requests often match.
var (
	genHTTPRules = []l7.Rule{
		{Method: "GET"},
		{Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/a"}},
		{Method: "POST", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/a/b"}},
		{Path: &l7.PathMatch{Type: l7.PathRegularExpression, Value: "/b.*"}},
		{Headers: []l7.HeaderMatch{{Type: l7.HeaderExact, Name: "X-K", Value: "1"}}},
	}
	genHTTPRequests = [][]string{
		{"GET", "/a"}, {"GET", "/b/c"}, {"POST", "/a/b"}, {"POST", "/c", "X-K: 1"}, {"PUT", "/a"},
	}
)

// genHTTPSnapshot is genSnapshot with about half the policies turned
// into WeirNetworkPolicies, HTTP rules on most of their single TCP ports.
func genHTTPSnapshot(r *rand.Rand, policies int) *Snapshot {
	s := genSnapshot(r, policies)
	s.HTTP = map[*networkingv1.NetworkPolicy]*PolicyHTTP{}
	for _, p := range s.Policies {
		if r.IntN(2) == 0 {
			continue
		}
		h := &PolicyHTTP{}
		for _, rule := range p.Spec.Ingress {
			h.Ingress = append(h.Ingress, genPortHTTP(r, rule.Ports))
		}
		for _, rule := range p.Spec.Egress {
			h.Egress = append(h.Egress, genPortHTTP(r, rule.Ports))
		}
		s.HTTP[p] = h
	}
	return s
}

func genPortHTTP(r *rand.Rand, ports []networkingv1.NetworkPolicyPort) [][]l7.Rule {
	out := make([][]l7.Rule, len(ports))
	for j, p := range ports {
		single := p.Port != nil && p.EndPort == nil && (p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP)
		if !single || r.IntN(3) == 0 {
			continue
		}
		for k := 1 + r.IntN(2); k > 0; k-- {
			out[j] = append(out[j], genHTTPRules[r.IntN(len(genHTTPRules))])
		}
	}
	return out
}

// TestHTTPCompiledMatchesEvaluate holds the compiled HTTP sets, joined
// across keys, port prefixes and the three lookups, to the direct
// reading: a request is allowed when a rule allowing the connection has
// no HTTP rules on its port, or one of the HTTP rules on the matching
// ports of the allowing rules matches it.
func TestHTTPCompiledMatchesEvaluate(t *testing.T) {
	c := NewCompiler()
	seen := map[string]int{}
	for seed := uint64(0); seed < 300; seed++ {
		r := rand.New(rand.NewPCG(seed, 13))
		s := genHTTPSnapshot(r, 1+r.IntN(5))
		res := c.Compile(s)
		if len(res.Errors) > 0 {
			t.Fatalf("seed %d: compile errors: %v", seed, res.Errors)
		}
		if err := checkHTTPAgainstEvaluate(t, s, res, seen); err != nil {
			t.Fatalf("seed %d: %v\npolicies: %s", seed, err, dumpPolicies(s))
		}
	}
	t.Logf("probes: %v", seen)
	for _, want := range []string{"unrestricted", "restricted allowed", "restricted denied", "connection denied"} {
		if seen[want] < 50 {
			t.Errorf("only %d probes reached %q: %v", seen[want], want, seen)
		}
	}
}

// TestClusterHTTPCompiledMatchesEvaluate holds conditional cluster
// rules, compiled into entries and judged as the datapath will
// (LookupHTTP), to the direct reading (EvaluateHTTP) on random clusters
// of NetworkPolicies, WeirNetworkPolicies and cluster policies of both
// tiers with HTTP rules: the connection, whether its requests are judged,
// each request's verdict, stage and deciding rule, and its Log rule.
func TestClusterHTTPCompiledMatchesEvaluate(t *testing.T) {
	c := NewCompiler()
	seen := map[string]int{}
	for seed := uint64(0); seed < 300; seed++ {
		r := rand.New(rand.NewPCG(seed, 17))
		s := genHTTPSnapshot(r, r.IntN(4))
		s.Nodes = genNodes()
		for i := 1 + r.IntN(4); i > 0; i-- {
			p := genClusterPolicy(r, fmt.Sprintf("c%d", i))
			if r.IntN(4) > 0 {
				p.Kind = KindWeirClusterNetworkPolicy
			}
			genClusterHTTP(r, p)
			s.ClusterPolicies = append(s.ClusterPolicies, p)
		}
		res := c.Compile(s)
		if err := checkHTTPAgainstEvaluate(t, s, res, seen); err != nil {
			t.Fatalf("seed %d: %v\npolicies: %s", seed, err, dumpPolicies(s))
		}
	}
	t.Logf("probes: %v", seen)
	for _, want := range []string{"restricted allowed", "restricted denied", "request admin", "request baseline",
		"request networkpolicy", "request networkpolicy-default-deny", "request default", "request logged",
		"request decided by an HTTP rule"} {
		if seen[want] < 20 {
			t.Errorf("only %d probes reached %q: %v", seen[want], want, seen)
		}
	}
}

func checkHTTPAgainstEvaluate(t *testing.T, s *Snapshot, res *Result, seen map[string]int) error {
	reqs := make([]*l7.Request, len(genHTTPRequests))
	for i, g := range genHTTPRequests {
		reqs[i] = httpReq(t, g[0], g[1], g[2:]...)
	}
	for i := range s.Pods {
		pod := &s.Pods[i]
		if !pod.Local {
			continue
		}
		for _, d := range []Direction{Ingress, Egress} {
			for _, peer := range genPeers() {
				for _, port := range []uint16{80, 81} {
					for _, req := range reqs {
						want, werr := EvaluateHTTP(s, pod, d, peer, port, req)
						got, gerr := res.LookupHTTP(pod.Key(), d, peer, port, req)
						where := fmt.Sprintf("%s %s peer %s port %d %s %s", pod.Key(), d, peer, port, req.Method, req.Path)
						if werr != nil || gerr != nil {
							return fmt.Errorf("%s: errors %v, %v", where, werr, gerr)
						}
						if got.Allowed != want.Allowed || got.Restricted != want.Restricted {
							return fmt.Errorf("%s: compiled allowed %v restricted %v (conn %+v request %+v), evaluated allowed %v restricted %v (conn %+v request %+v)",
								where, got.Allowed, got.Restricted, got.Conn, got.Request, want.Allowed, want.Restricted, want.Conn, want.Request)
						}
						if got.Restricted {
							if err := kernelWalkAgrees(res, pod.Key(), d, peer, port, req, got); err != nil {
								return fmt.Errorf("%s: %w", where, err)
							}
							if err := sameDecision(res, got.Request, want.Request); err != nil {
								return fmt.Errorf("%s: request: %w", where, err)
							}
							seen["request "+got.Request.Stage.String()]++
							if got.Request.Log != 0 {
								seen["request logged"]++
							}
							if _, ok := res.HTTPTiers[got.Rule.Rule]; ok {
								seen["request decided by an HTTP rule"]++
							}
						}
						if got.Restricted && got.Rule != (HTTPRuleRef{}) {
							m, err := l7.Compile([]l7.Rule{res.HTTPRules[got.Rule]})
							if i, _ := m.Match(req); err != nil || i != 0 {
								return fmt.Errorf("%s: compiled names rule %+v, which does not match", where, got.Rule)
							}
						}
						switch {
						case !got.Conn.Allowed():
							seen["connection denied"]++
						case !got.Restricted:
							seen["unrestricted"]++
						case got.Allowed:
							seen["restricted allowed"]++
						default:
							seen["restricted denied"]++
						}
					}
				}
			}
		}
	}
	return nil
}

// l7Policy is a WeirNetworkPolicy selecting app=web, ingress from
// app=client on TCP port 80 with the given HTTP rules.
func l7Policy(name string, rules ...l7.Rule) (*networkingv1.NetworkPolicy, *PolicyHTTP) {
	port := intstr.FromInt32(80)
	p := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
			}},
		},
	}
	return p, &PolicyHTTP{Ingress: [][][]l7.Rule{{rules}}}
}

func l7Cluster(policies ...any) *Snapshot {
	s := &Snapshot{
		Namespaces: map[string]Namespace{"default": {Name: "default"}},
		Pods: []Pod{
			{Namespace: "default", Name: "web", Labels: map[string]string{"app": "web"}, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.2")}, Local: true},
			{Namespace: "default", Name: "client", Labels: map[string]string{"app": "client"}, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.3")}},
			{Namespace: "default", Name: "other", Labels: map[string]string{"app": "other"}, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.4")}},
		},
		Identities: map[string]Identity{},
		HTTP:       map[*networkingv1.NetworkPolicy]*PolicyHTTP{},
	}
	for _, pod := range s.Pods {
		s.Identities[IdentityLabels(s.namespace(pod.Namespace), pod.Labels).Key()] = MinClusterIdentity + Identity(len(s.Identities))
	}
	for i := 0; i < len(policies); i += 2 {
		p := policies[i].(*networkingv1.NetworkPolicy)
		s.Policies = append(s.Policies, p)
		if h, _ := policies[i+1].(*PolicyHTTP); h != nil {
			s.HTTP[p] = h
		}
	}
	return s
}

var (
	l7Client = netip.MustParseAddr("10.0.0.3")
	l7Other  = netip.MustParseAddr("10.0.0.4")
)

func TestHTTPRulesAddUp(t *testing.T) {
	landing := l7.Rule{Method: "POST", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/v1/request-landing"}}
	health := l7.Rule{Method: "GET", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/healthz"}}
	deathstar, deathstarHTTP := l7Policy("deathstar", landing)
	probes, probesHTTP := l7Policy("probes", health)
	l4Only, _ := l7Policy("l4")
	post := httpReq(t, "POST", "/v1/request-landing")
	exhaust := httpReq(t, "PUT", "/v1/exhaust-port")
	healthz := httpReq(t, "GET", "/healthz")
	for _, tc := range []struct {
		name     string
		s        *Snapshot
		req      *l7.Request
		peer     netip.Addr
		allowed  bool
		restrict bool
	}{
		{"the allowed request", l7Cluster(deathstar, deathstarHTTP), post, l7Client, true, true},
		{"a request no rule matches", l7Cluster(deathstar, deathstarHTTP), exhaust, l7Client, false, true},
		{"a peer the rule does not name", l7Cluster(deathstar, deathstarHTTP), post, l7Other, false, false},
		{"two policies: their rules add up", l7Cluster(deathstar, deathstarHTTP, probes, probesHTTP), healthz, l7Client, true, true},
		{"two policies: still a union, not all", l7Cluster(deathstar, deathstarHTTP, probes, probesHTTP), exhaust, l7Client, false, true},
		{"an L4 allow of the same port lifts HTTP rules", l7Cluster(deathstar, deathstarHTTP, l4Only, nil), exhaust, l7Client, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := NewCompiler().Compile(tc.s)
			if len(res.Errors) > 0 {
				t.Fatal(res.Errors)
			}
			got, err := res.LookupHTTP("default/web", Ingress, tc.peer, 80, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if got.Allowed != tc.allowed || got.Restricted != tc.restrict {
				t.Errorf("allowed %v restricted %v, want %v %v", got.Allowed, got.Restricted, tc.allowed, tc.restrict)
			}
			if got.Allowed && got.Restricted {
				ref := res.Rules[got.Rule.Rule]
				if ref.Kind != KindWeirNetworkPolicy || !strings.HasPrefix(ref.String(), "weirnetworkpolicy default/") {
					t.Errorf("deciding rule %v, want a weirnetworkpolicy's", ref)
				}
			}
		})
	}
}

// TestHTTPRulesRefused: HTTP rules the datapath cannot hold to refuse
// their rule, reported as the policy's error, and what the rule would
// allow stays closed, as for any rule Weir cannot read.
func TestHTTPRulesRefused(t *testing.T) {
	get := []l7.Rule{{Method: "GET"}}
	for _, tc := range []struct {
		name string
		edit func(p *networkingv1.NetworkPolicy, h *PolicyHTTP)
		want string
	}{
		{"UDP port", func(p *networkingv1.NetworkPolicy, h *PolicyHTTP) {
			udp := corev1.ProtocolUDP
			p.Spec.Ingress[0].Ports[0].Protocol = &udp
		}, "on a UDP port"},
		{"port range", func(p *networkingv1.NetworkPolicy, h *PolicyHTTP) {
			end := int32(90)
			p.Spec.Ingress[0].Ports[0].EndPort = &end
		}, "not a range"},
		{"every port", func(p *networkingv1.NetworkPolicy, h *PolicyHTTP) {
			p.Spec.Ingress[0].Ports[0].Port = nil
		}, "not a range or every port"},
		{"bad rule", func(p *networkingv1.NetworkPolicy, h *PolicyHTTP) {
			h.Ingress[0][0] = []l7.Rule{{Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/a/../b"}}}
		}, "dot segment"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, h := l7Policy("bad", get...)
			tc.edit(p, h)
			res := NewCompiler().Compile(l7Cluster(p, h))
			if len(res.Errors) != 1 || !errors.Is(res.Errors[0], ErrInvalidPolicy) || !strings.Contains(res.Errors[0].Error(), tc.want) ||
				!strings.HasPrefix(res.Errors[0].Error(), "weirnetworkpolicy default/bad: ") {
				t.Fatalf("errors %v, want one weirnetworkpolicy ErrInvalidPolicy saying %q", res.Errors, tc.want)
			}
			got, _ := res.LookupHTTP("default/web", Ingress, l7Client, 80, httpReq(t, "GET", "/"))
			if got.Allowed || got.Conn.Allowed() {
				t.Fatalf("a refused policy's subject let a connection through: %+v", got)
			}
		})
	}
}

// TestHTTPSetNumbers: a set keeps its number across compiles while it is
// unchanged; a changed rule makes a new number, and the old one is never
// used again, so the datapath can hold a set under its number for good;
// the Diff writes a new set with its rules and lets the gone one go.
func TestHTTPSetNumbers(t *testing.T) {
	landing := l7.Rule{Method: "POST", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/v1/request-landing"}}
	health := l7.Rule{Method: "GET", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/healthz"}}
	c := NewCompiler()
	setOf := func(res *Result) HTTPSetID {
		t.Helper()
		if len(res.Errors) > 0 {
			t.Fatal(res.Errors)
		}
		var id HTTPSetID
		for _, e := range res.Endpoints["default/web"].Entries {
			if e.HTTP != 0 {
				if id != 0 && e.HTTP != id {
					t.Fatalf("two sets (%d, %d) where one policy gives one", id, e.HTTP)
				}
				id = e.HTTP
			}
		}
		if id == 0 {
			t.Fatal("no entry restricted to HTTP rules")
		}
		return id
	}
	p, h := l7Policy("deathstar", landing)
	first := c.Compile(l7Cluster(p, h))
	a := setOf(first)
	again := c.Compile(l7Cluster(p, h))
	if got := setOf(again); got != a {
		t.Fatalf("an unchanged set went from %d to %d", a, got)
	}
	if d := DiffResults(first, again); !d.Empty() {
		t.Fatalf("an unchanged cluster's diff: %+v", d)
	}
	// The same policy, its rule changed: another number.
	p2, h2 := l7Policy("deathstar", health)
	changed := c.Compile(l7Cluster(p2, h2))
	b := setOf(changed)
	if b == a {
		t.Fatalf("set %d kept its number with other rules", a)
	}
	d := DiffResults(again, changed)
	if rules, ok := d.HTTPSets[b]; !ok || len(rules) != 1 || rules[0].Path.Value != "/healthz" {
		t.Fatalf("diff's new sets %+v, want %d with the /healthz rule", d.HTTPSets, b)
	}
	if len(d.HTTPSetsGone) != 1 || d.HTTPSetsGone[0] != a {
		t.Fatalf("diff's gone sets %v, want [%d]", d.HTTPSetsGone, a)
	}
	// Back to the first rule: a number of its own again, never a.
	back := c.Compile(l7Cluster(p, h))
	if got := setOf(back); got == a || got == b {
		t.Fatalf("a set came back under a used number %d (a %d, b %d)", got, a, b)
	}
	if d := DiffResults(nil, back); len(d.HTTPSets) == 0 {
		t.Fatal("a first load's diff writes no set")
	}
}

// kernelWalkAgrees holds the datapath's walk of a judged request
// (l7.JudgeTiers over the kernel's form of the entries' L7 sets, the
// flow TierFlowOf keeps) to LookupHTTP's decision: the verdict, the
// stage, and the rule that decided it, named through the set. Where the
// kernel leaves the request to user space, the walk over the full
// matchers (the proxy's) must agree instead.
func kernelWalkAgrees(res *Result, pod string, d Direction, peer netip.Addr, port uint16, req *l7.Request, got HTTPDecision) error {
	ep := res.Endpoints[pod]
	found := ep.lookup(res, d, peer, ProtoTCP, port)
	flow := TierFlowOf(ep.Enforced[d], found)
	var kernel, full [3]*l7.TierSet
	var ids [3]HTTPSetID
	for i, e := range found {
		if e == nil || e.L7 == 0 {
			continue
		}
		ids[i] = e.L7
		rules := make([]l7.Rule, len(res.HTTPSets[e.L7]))
		for j, ref := range res.HTTPSets[e.L7] {
			rules[j] = res.HTTPRules[ref]
		}
		order, err := l7.NewSetOrder(res.SetOrder(e.L7))
		if err != nil {
			return err
		}
		k, err := l7.CompileKernel(rules, l7.HashKey{})
		if err != nil {
			return err
		}
		cand, userSpace, refuse := k.Candidates(req)
		if refuse {
			return fmt.Errorf("the kernel refuses a request LookupHTTP judged")
		}
		kernel[i] = &l7.TierSet{Cand: cand, UserSpace: userSpace, Order: &order}
		m, err := l7.Compile(rules)
		if err != nil {
			return err
		}
		c, err := m.Candidates(req)
		if err != nil {
			return err
		}
		full[i] = &l7.TierSet{Cand: c, Order: &order}
	}
	v := l7.JudgeTiers(flow, kernel)
	if v.Verdict == l7.KernelUserSpace {
		v = l7.JudgeTiers(flow, full)
	}
	if allowed := v.Verdict == l7.KernelAllow; allowed != got.Allowed || v.Stage != uint8(got.Request.Stage) {
		return fmt.Errorf("kernel walk %+v, LookupHTTP allowed %v at %s (%+v)", v, got.Allowed, got.Request.Stage, got.Request)
	}
	var by HTTPRuleRef
	if v.Set >= 0 {
		by = res.HTTPSets[ids[v.Set]][v.Bit]
	}
	_, tierRule := res.HTTPTiers[by.Rule]
	switch {
	case v.Stage == l7.StageAdmin || v.Stage == l7.StageBaseline:
		if v.Set < 0 && RuleID(v.Rule) != got.Request.Rule || v.Set >= 0 && by != got.Rule {
			return fmt.Errorf("kernel walk decided by rule %d / %+v, LookupHTTP by %v / %+v", v.Rule, by, got.Request.Rule, got.Rule)
		}
	case v.Stage == l7.StageNetworkPolicy && v.Set >= 0 && tierRule:
		return fmt.Errorf("kernel walk allowed at NetworkPolicy by a cluster rule's HTTP rule %+v", by)
	}
	return nil
}

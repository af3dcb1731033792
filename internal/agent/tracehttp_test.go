package agent

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/policy"
)

var (
	traceFighter = netip.MustParseAddr("10.244.2.9")
	traceXWing   = netip.MustParseAddr("10.244.2.10")
)

// deathstarPolicy compiles the demo's WeirNetworkPolicy: the empire's
// ships may POST /v1/request-landing on port 80, and GET /v1/status with
// an X-Fleet header (a rule the kernel leaves to user space).
func deathstarPolicy(t *testing.T, cluster ...*policy.ClusterPolicy) *policy.Result {
	t.Helper()
	port := intstr.FromInt32(80)
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "empire", Name: "deathstar"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"class": "deathstar"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"org": "empire"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
			}},
		},
	}
	rules := []l7.Rule{
		{Method: "POST", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/v1/request-landing"}},
		{Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/v1/status"},
			Headers: []l7.HeaderMatch{{Type: l7.HeaderPresent, Name: "X-Fleet"}}},
	}
	s := &policy.Snapshot{
		Namespaces: map[string]policy.Namespace{"empire": {Name: "empire"}},
		Pods: []policy.Pod{
			{Namespace: "empire", Name: "deathstar-0", Labels: map[string]string{"class": "deathstar"}, IPs: []netip.Addr{netip.MustParseAddr("10.244.1.7")}, Local: true},
			{Namespace: "empire", Name: "tiefighter", Labels: map[string]string{"org": "empire"}, IPs: []netip.Addr{traceFighter}},
			{Namespace: "empire", Name: "xwing", Labels: map[string]string{"org": "alliance"}, IPs: []netip.Addr{traceXWing}},
		},
		Identities:      map[string]policy.Identity{},
		Policies:        []*networkingv1.NetworkPolicy{np},
		HTTP:            map[*networkingv1.NetworkPolicy]*policy.PolicyHTTP{np: {Ingress: [][][]l7.Rule{{rules}}}},
		ClusterPolicies: cluster,
	}
	for i, p := range s.Pods {
		s.Identities[policy.IdentityLabels(s.Namespaces[p.Namespace], p.Labels).Key()] = policy.MinClusterIdentity + policy.Identity(i)
	}
	res := policy.NewCompiler().Compile(s)
	if len(res.Errors) > 0 {
		t.Fatal(res.Errors)
	}
	return res
}

func TestTraceHTTPExplainsTheRules(t *testing.T) {
	res := deathstarPolicy(t)
	trace := func(peer netip.Addr, method, path string, headers ...string) *api.TraceHTTP {
		t.Helper()
		h, err := traceHTTP(res, "empire/deathstar-0", policy.Ingress, peer, 80, &api.TraceRequest{Method: method, Path: path, Host: "deathstar.empire", Headers: headers})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	h := trace(traceFighter, "POST", "/v1/request-landing")
	if h.Verdict != "allowed" || !h.Restricted || len(h.Rules) != 2 || h.Kernel != "kernel: allowed there" ||
		h.Rule != "weirnetworkpolicy empire/deathstar ingress[0] ports[0].http[0] (POST Exact /v1/request-landing)" {
		t.Fatalf("landing: %+v", h)
	}
	h = trace(traceFighter, "PUT", "/v1/exhaust-port")
	if h.Verdict != "denied" || !strings.Contains(h.Rule, "403") || h.Kernel != "kernel: denied there" {
		t.Fatalf("exhaust port: %+v", h)
	}
	// Only the header rule may match: judged in the kernel too.
	h = trace(traceFighter, "GET", "/v1/status/ok")
	if h.Verdict != "denied" || h.Kernel != "kernel: denied there" {
		t.Fatalf("status without the header: %+v", h)
	}
	h = trace(traceFighter, "GET", "/v1/status/ok", "x-fleet: 7")
	if h.Verdict != "allowed" || h.Kernel != "kernel: allowed there" || !strings.Contains(h.Rule, "http[1]") {
		t.Fatalf("status with the header: %+v", h)
	}
	h = trace(traceFighter, "GET", "/v1/status/ok", "X-Fleet: 7", "X-Fleet: 8")
	if h.Verdict != "refused" || !strings.Contains(h.Rule, "400") {
		t.Fatalf("status with the header twice: %+v", h)
	}
	for _, bad := range []string{"X-Fleet 7", " X-Fleet: 7", "Host: other", "X-Fleet: 7\r\nX-Evil: 1"} {
		if _, err := traceHTTP(res, "empire/deathstar-0", policy.Ingress, traceFighter, 80, &api.TraceRequest{Method: "GET", Path: "/", Headers: []string{bad}}); !errors.Is(err, errTraceRequest) {
			t.Errorf("header %q traced: %v", bad, err)
		}
	}
	// A path servers read differently is refused before any rule.
	h = trace(traceFighter, "GET", "/v1/../admin")
	if h.Verdict != "refused" || !strings.Contains(h.Rule, "400") {
		t.Fatalf("dot segment: %+v", h)
	}
	// A peer no rule names: the connection never opens.
	h = trace(traceXWing, "POST", "/v1/request-landing")
	if h.Verdict != "" || h.Restricted || !strings.Contains(h.Note, "denied before any request") {
		t.Fatalf("x-wing: %+v", h)
	}
	if _, err := traceHTTP(res, "empire/deathstar-0", policy.Ingress, traceFighter, 80, &api.TraceRequest{Method: "GET", Path: "/a b"}); err == nil {
		t.Fatal("a path with a space was traced")
	}
	if _, err := traceHTTP(res, "empire/deathstar-0", policy.Ingress, traceFighter, 80, &api.TraceRequest{Method: "GET"}); err == nil {
		t.Fatal("a request without a path was traced")
	}
}

// TestTraceHTTPExplainsEgressRules: a client's egress HTTP rules are
// traced from the client's end: judged on its socket in the kernel, and
// what the kernel leaves to user space closes the connection there.
func TestTraceHTTPExplainsEgressRules(t *testing.T) {
	port := intstr.FromInt32(80)
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "empire", Name: "fighter-out"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"org": "empire"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Port: &port}}}},
		},
	}
	rules := []l7.Rule{
		{Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/public"}},
		{Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/fleet"},
			Headers: []l7.HeaderMatch{{Type: l7.HeaderRegularExpression, Name: "X-Fleet", Value: "^[0-9]+$"}}},
	}
	deathstar := netip.MustParseAddr("10.244.1.7")
	s := &policy.Snapshot{
		Namespaces: map[string]policy.Namespace{"empire": {Name: "empire"}},
		Pods: []policy.Pod{
			{Namespace: "empire", Name: "deathstar-0", Labels: map[string]string{"class": "deathstar"}, IPs: []netip.Addr{deathstar}},
			{Namespace: "empire", Name: "tiefighter", Labels: map[string]string{"org": "empire"}, IPs: []netip.Addr{traceFighter}, Local: true},
		},
		Identities: map[string]policy.Identity{},
		Policies:   []*networkingv1.NetworkPolicy{np},
		HTTP:       map[*networkingv1.NetworkPolicy]*policy.PolicyHTTP{np: {Egress: [][][]l7.Rule{{rules}}}},
	}
	for i, p := range s.Pods {
		s.Identities[policy.IdentityLabels(s.Namespaces[p.Namespace], p.Labels).Key()] = policy.MinClusterIdentity + policy.Identity(i)
	}
	res := policy.NewCompiler().Compile(s)
	if len(res.Errors) > 0 {
		t.Fatal(res.Errors)
	}
	trace := func(method, path string, headers ...string) *api.TraceHTTP {
		t.Helper()
		h, err := traceHTTP(res, "empire/tiefighter", policy.Egress, deathstar, 80, &api.TraceRequest{Method: method, Path: path, Host: "deathstar", Headers: headers})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	h := trace("GET", "/public/plans")
	if h.Verdict != "allowed" || !h.Restricted || len(h.Rules) != 2 || h.Kernel != "kernel: allowed there" ||
		!strings.Contains(h.Rule, "egress[0] ports[0].http[0]") {
		t.Fatalf("allowed: %+v", h)
	}
	if h = trace("PUT", "/v1/exhaust-port"); h.Verdict != "denied" || h.Kernel != "kernel: denied there" {
		t.Fatalf("denied: %+v", h)
	}
	if h = trace("GET", "/fleet/1", "X-Fleet: 7"); h.Verdict != "allowed" || !strings.Contains(h.Kernel, "the connection is closed") {
		t.Fatalf("a rule only user space judges: %+v", h)
	}
}

// TestTraceHTTPExplainsClusterRules: a request a conditional cluster
// rule decides is traced to that rule and its HTTP rule; one it does not
// match goes on to the WeirNetworkPolicy; and the trace says such
// connections' requests are judged in user space, walking the tiers.
func TestTraceHTTPExplainsClusterRules(t *testing.T) {
	res := deathstarPolicy(t, noPutPolicy())
	trace := func(method, path string) *api.TraceHTTP {
		t.Helper()
		h, err := traceHTTP(res, "empire/deathstar-0", policy.Ingress, traceFighter, 80, &api.TraceRequest{Method: method, Path: path})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	h := trace("PUT", "/v1/exhaust-port")
	want := `answered 403: weirclusternetworkpolicy no-put (Admin tier, priority 5) ingress[0] "no-put" Deny http[0] (PUT)`
	if h.Verdict != "denied" || h.Rule != want || !strings.HasPrefix(h.Kernel, "user space: cluster rules with HTTP rules") {
		t.Fatalf("PUT: %+v, want denied by %s", h, want)
	}
	if len(h.Rules) != 3 || !strings.Contains(h.Rules[0], "deny the requests it matches") {
		t.Fatalf("rules: %q, want the cluster rule's first, then the policy's two", h.Rules)
	}
	h = trace("POST", "/v1/request-landing")
	if h.Verdict != "allowed" || !strings.Contains(h.Rule, "weirnetworkpolicy empire/deathstar ingress[0] ports[0].http[0]") {
		t.Fatalf("POST: %+v", h)
	}
	h = trace("GET", "/")
	if h.Verdict != "denied" || h.Rule != "answered 403: no HTTP rule of the connection matches" {
		t.Fatalf("GET: %+v", h)
	}
}

// TestTierRecordsNameTheRule: a request the proxy judged by walking the
// tiers (a flow with conditional cluster rules) is recorded with what
// decided it there: the conditional Deny and its HTTP rule, answered
// 403; a request that rule does not match, allowed further on by the
// WeirNetworkPolicy's HTTP rule.
func TestTierRecordsNameTheRule(t *testing.T) {
	cnp := noPutPolicy()
	// A Log of POST requests before the Deny: recorded, and they go on.
	logPost := cnp.Spec.Ingress[0]
	logPost.Name, logPost.Action = "log-post", "Log"
	cnp.Spec.Ingress = append([]npav1alpha2.ClusterNetworkPolicyIngressRule{logPost}, cnp.Spec.Ingress...)
	cnp.HTTP.Ingress = append([][]l7.Rule{{{Method: "POST"}}}, cnp.HTTP.Ingress...)
	res := deathstarPolicy(t, cnp)
	server := netip.MustParseAddr("10.244.1.7")
	names := &flowNames{byIP: map[netip.Addr]string{server: "empire/deathstar-0", traceFighter: "empire/tiefighter"},
		rules: res.Rules, httpSets: res.HTTPSets, httpRules: res.HTTPRules, policy: res}
	h := newHTTPFlows("n1", func(k uint32) (policy.HTTPSetID, bool) { return policy.HTTPSetID(k &^ datapath.L7SetTiered), k != 0 })
	record := func(head string) api.Flow {
		t.Helper()
		reqs, err := l7.NewParser(l7.Limits{}).Feed([]byte(head))
		if err != nil || len(reqs) != 1 {
			t.Fatalf("%q: %v", head, err)
		}
		d, err := res.LookupHTTP("empire/deathstar-0", policy.Ingress, traceFighter, 80, reqs[0])
		if err != nil {
			t.Fatal(err)
		}
		ev := datapath.L7Event{Cookie: 7, Client: netip.AddrPortFrom(traceFighter, 40000), Server: netip.AddrPortFrom(server, 80),
			Sets: [3]uint32{datapath.L7SetTiered | 1}, Count: 1, Verdict: datapath.L7Allowed, Proxied: true, Policy: &d,
			Line: []byte(strings.SplitN(head, "\r\n", 2)[0])}
		if !d.Allowed {
			ev.Verdict, ev.Answered = datapath.L7Denied, true
		}
		return h.explain(names, ev)
	}
	f := record("PUT /v1/exhaust-port HTTP/1.1\r\nHost: d\r\nContent-Length: 0\r\n\r\n")
	want := `denied by weirclusternetworkpolicy no-put (Admin tier, priority 5) ingress[1] "no-put" Deny http[0] (PUT) (judged in user space)`
	if f.Verdict != "denied" || f.Rule != want || f.Stage != StageHTTP || f.HTTP.Status != 403 ||
		f.Decider == nil || f.Decider.Name != "no-put" || f.Decider.Tier != "Admin" || f.HTTP.Rule == nil || f.HTTP.Rule.Match != "PUT" {
		t.Fatalf("PUT: %+v %+v %+v, want %s", f, f.Decider, f.HTTP, want)
	}
	f = record("POST /v1/request-landing HTTP/1.1\r\nHost: d\r\nContent-Length: 0\r\n\r\n")
	if f.Verdict != "allowed" || !strings.Contains(f.Rule, "allowed by weirnetworkpolicy empire/deathstar ingress[0] ports[0].http[0]") ||
		f.Decider == nil || f.Decider.Name != "deathstar" || f.HTTP.Method != "POST" ||
		f.LoggedBy == nil || f.LoggedBy.Name != "no-put" || f.LoggedBy.RuleName != "log-post" || f.LoggedBy.Action != "Log" {
		t.Fatalf("POST: %+v, decided by %+v, logged by %+v", f, f.Decider, f.LoggedBy)
	}
	// Neither cluster rule matches, nor the WeirNetworkPolicy's: denied
	// where NetworkPolicy denies by default, in words.
	f = record("GET /v1/exhaust-port HTTP/1.1\r\nHost: d\r\n\r\n")
	if f.Verdict != "denied" || f.Rule != "denied: no HTTP rule of the connection matches (judged in user space)" || f.Decider != nil {
		t.Fatalf("GET: %+v, decided by %+v", f, f.Decider)
	}
}

// noPutPolicy is an Admin rule, from every namespace on TCP port 80,
// that denies PUT requests (a conditional Deny) and nothing else.
func noPutPolicy() *policy.ClusterPolicy {
	cnp := &policy.ClusterPolicy{Kind: policy.KindWeirClusterNetworkPolicy, Name: "no-put",
		HTTP: &policy.ClusterHTTP{Ingress: [][]l7.Rule{{{Method: "PUT"}}}}}
	cnp.Spec.Tier, cnp.Spec.Priority = npav1alpha2.AdminTier, 5
	cnp.Spec.Subject.Namespaces = &metav1.LabelSelector{}
	cnp.Spec.Ingress = []npav1alpha2.ClusterNetworkPolicyIngressRule{{Name: "no-put", Action: "Deny",
		From:      []npav1alpha2.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}},
		Protocols: []npav1alpha2.ClusterNetworkPolicyProtocol{{TCP: &npav1alpha2.ClusterNetworkPolicyProtocolTCP{DestinationPort: &npav1alpha2.Port{Number: 80}}}}}}
	return cnp
}

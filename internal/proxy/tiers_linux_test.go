package proxy

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/policy"
)

// tieredPolicy is a cluster with one local pod, x/web at 127.0.0.1, and
// a WeirClusterNetworkPolicy whose Admin rules on port, from every pod,
// are in order: Deny of PUT requests, Accept of GET /healthz..., Deny of
// everything else (no HTTP rules).
func tieredPolicy(t *testing.T, port uint16) *policy.Result {
	return tieredPolicyOf(t, port, false)
}

// tieredPolicyOf is tieredPolicy, its rules x/web's egress rules (to
// every pod) when egress.
func tieredPolicyOf(t *testing.T, port uint16, egress bool) *policy.Result {
	t.Helper()
	ns := policy.Namespace{Name: "x"}
	web := policy.Pod{Namespace: "x", Name: "web", Labels: map[string]string{"app": "web"},
		IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, Local: true}
	p := &policy.ClusterPolicy{Kind: policy.KindWeirClusterNetworkPolicy, Name: "health-only"}
	p.Spec.Tier, p.Spec.Priority = npav1alpha2.AdminTier, 10
	p.Spec.Subject.Pods = &npav1alpha2.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}
	rule := func(action string) npav1alpha2.ClusterNetworkPolicyIngressRule {
		return npav1alpha2.ClusterNetworkPolicyIngressRule{Action: npav1alpha2.ClusterNetworkPolicyRuleAction(action),
			From: []npav1alpha2.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}},
			Protocols: []npav1alpha2.ClusterNetworkPolicyProtocol{{TCP: &npav1alpha2.ClusterNetworkPolicyProtocolTCP{
				DestinationPort: &npav1alpha2.Port{Number: int32(port)}}}}}
	}
	add := func(action string, http []l7.Rule) {
		in := rule(action)
		if !egress {
			p.AddIngress(in, http)
			return
		}
		p.AddEgress(npav1alpha2.ClusterNetworkPolicyEgressRule{Action: in.Action, Protocols: in.Protocols,
			To: []npav1alpha2.ClusterNetworkPolicyEgressPeer{{Namespaces: &metav1.LabelSelector{}}}}, http)
	}
	add("Deny", []l7.Rule{{Method: "PUT"}})
	add("Accept", []l7.Rule{{Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/healthz"}}})
	add("Deny", nil)
	s := &policy.Snapshot{
		Namespaces:      map[string]policy.Namespace{"x": ns},
		Pods:            []policy.Pod{web},
		ClusterPolicies: []*policy.ClusterPolicy{p},
		Identities:      map[string]policy.Identity{policy.IdentityLabels(ns, web.Labels).Key(): policy.MinClusterIdentity},
	}
	res := policy.NewCompiler().Compile(s)
	if len(res.Errors) > 0 {
		t.Fatal(res.Errors)
	}
	return res
}

// TestTieredConnections: a connection whose flow names a set with
// conditional cluster rules (datapath.L7SetTiered) is handed over at its
// first head, and every request is judged against the whole policy in
// precedence order (TierJudge), on one keep-alive connection with real
// sockets: a conditional Deny comes first for PUT, a conditional Accept
// for GET /healthz, and the rule without HTTP rules after them denies
// the rest; each denial is a 403 and the connection goes on. The records
// name the deciding cluster rule and its HTTP rule.
func TestTieredConnections(t *testing.T) {
	var res *policy.Result
	srv, s, records, _ := handedSetupWith(t, handedOpts{
		rules: handedRules, slots: 4, port: datapath.L7SetTiered | 1,
		judge: func(sets *SetJudge, port uint16) Judge {
			res = tieredPolicy(t, port)
			return &TierJudge{Sets: sets, Policy: func(server netip.Addr) (*policy.Result, string, bool) {
				return res, "x/web", server == netip.MustParseAddr("127.0.0.1")
			}}
		},
	})
	c := dial(t, srv.addr)
	tieredConversation(t, c, srv)
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Handed != 1 {
		t.Fatalf("counters %+v: want the one connection handed", st)
	}
	// Each request's record names what decided it in the precedence
	// order: the Accept's and the first Deny's HTTP rules, the last
	// Deny without HTTP rules.
	wantBy := map[string]struct {
		allowed bool
		rule    int // index of the cluster rule in the policy
		http    bool
	}{
		"GET /healthz": {true, 1, true}, "PUT /healthz": {false, 0, true},
		"GET /other": {false, 2, false}, "GET /healthz/ready": {true, 1, true},
	}
	if len(*records) != len(wantBy) {
		t.Fatalf("%d records, want %d", len(*records), len(wantBy))
	}
	for _, r := range *records {
		key := r.Request.Method + " " + r.Request.Path
		w, d := wantBy[key], r.Decision.Policy
		if d == nil || d.Allowed != w.allowed || !d.Restricted || d.Request.Stage != policy.StageAdmin {
			t.Fatalf("%s: decision %+v, want allowed=%v at the Admin tier", key, d, w.allowed)
		}
		by := d.Request.Rule
		if w.http {
			by = d.Rule.Rule
		}
		if ref := res.Rules[by]; ref.Name != "health-only" || ref.Index != w.rule || (d.Rule != policy.HTTPRuleRef{}) != w.http {
			t.Fatalf("%s: decided by %+v (HTTP rule %+v), want rule %d of health-only (with HTTP rules: %v)", key, ref, d.Rule, w.rule, w.http)
		}
		if r.Sets[0]&datapath.L7SetTiered == 0 {
			t.Fatalf("%s: judged against sets %v, want the tiered set", key, r.Sets)
		}
	}
}

// TestTieredEgress: the same rules as x/web's egress rules, on a
// connection its client opens: handed to the proxy from the client's
// socket at the first head, each request judged against the policy's
// egress side in precedence order, the denied ones answered 403 on the
// same connection, the records the client's.
func TestTieredEgress(t *testing.T) {
	srv, s, records, _ := handedSetupWith(t, handedOpts{
		rules: handedRules, slots: 2, egress: true,
		judge: func(sets *SetJudge, port uint16) Judge {
			res := tieredPolicyOf(t, port, true)
			return &TierJudge{Sets: sets, Policy: func(local netip.Addr) (*policy.Result, string, bool) {
				return res, "x/web", local == netip.MustParseAddr("127.0.0.1")
			}}
		},
	})
	c, client := dialRestricted(t, s, srv, [3]uint32{datapath.L7SetTiered | 1})
	tieredConversation(t, c, srv)
	recs := waitRecords(t, records, 4)
	for i, allowed := range []bool{true, false, false, true} {
		r := recs[i]
		if d := r.Decision.Policy; d == nil || d.Allowed != allowed || d.Request.Stage != policy.StageAdmin ||
			!r.Handoff.Egress || r.Handoff.Client != client {
			t.Fatalf("record %d: %+v (decision %+v), want allowed=%v at the Admin tier, egress from %v", i, r, d, allowed, client)
		}
	}
}

// tieredConversation has c ask tieredPolicy's four questions on one
// keep-alive connection: GET /healthz served, PUT /healthz and GET
// /other answered 403, GET /healthz/ready served, and only the two GETs
// of /healthz reaching srv.
func tieredConversation(t *testing.T, c net.Conn, srv *server) {
	t.Helper()
	got := converse(t, c,
		"GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n",
		"PUT /healthz HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nok",
		"GET /other HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET /healthz/ready HTTP/1.1\r\nHost: h\r\n\r\n")
	want := []string{"GET /healthz", "HTTP/1.1 403 Forbidden", "HTTP/1.1 403 Forbidden", "GET /healthz/ready"}
	for i, w := range want {
		if !strings.Contains(got[i], w) {
			t.Fatalf("step %d: got %q, want %q", i, got[i], w)
		}
	}
	if list := srv.served(); list != "GET /healthz\nGET /healthz/ready" {
		t.Fatalf("served:\n%s\nwant only the two GETs of /healthz", list)
	}
}

// TestTierJudge: without sockets, the judge reads a tiered connection's
// requests against the policy and fails closed where it cannot: a server
// that is no local endpoint, or no policy loaded yet. Other connections
// are the sets' to judge.
func TestTierJudge(t *testing.T) {
	res := tieredPolicy(t, 8080)
	local := netip.MustParseAddr("127.0.0.1")
	j := &TierJudge{Sets: NewSetJudge(func(uint32) *l7.Matcher { return nil }),
		Policy: func(server netip.Addr) (*policy.Result, string, bool) { return res, "x/web", server == local }}
	req := func(line string) *l7.Request {
		reqs, err := l7.NewParser(l7.Limits{}).Feed([]byte(line + " HTTP/1.1\r\nHost: h\r\n\r\n"))
		if err != nil || len(reqs) != 1 {
			t.Fatalf("%q: %v", line, err)
		}
		return reqs[0]
	}
	tiered := Conn{Server: netip.AddrPortFrom(local, 8080), Client: netip.AddrPortFrom(local, 40000), Sets: [3]uint32{datapath.L7SetTiered | 4}}
	for _, tc := range []struct {
		c    Conn
		line string
		want Verdict
	}{
		{tiered, "GET /healthz", Allow},
		{tiered, "PUT /healthz", Deny},
		{tiered, "GET /", Deny},
		{Conn{Server: netip.MustParseAddrPort("10.0.0.1:8080"), Client: tiered.Client, Sets: tiered.Sets}, "GET /healthz", Deny},
		{Conn{Server: tiered.Server, Client: tiered.Client, Sets: [3]uint32{4}}, "GET /healthz", Deny}, // the sets' judge: no matcher
		{Conn{Server: tiered.Server, Client: tiered.Client}, "PUT /", Allow},                           // no sets: unrestricted
	} {
		if got := j.Judge(tc.c, req(tc.line)); got.Verdict != tc.want || (datapath.TieredSets(tc.c.Sets) && tc.c.Server == tiered.Server) != (got.Policy != nil) {
			t.Errorf("%v %s: %+v, want %v", tc.c, tc.line, got, tc.want)
		}
	}
	none := &TierJudge{Sets: j.Sets, Policy: func(netip.Addr) (*policy.Result, string, bool) { return nil, "", false }}
	if got := none.Judge(tiered, req("GET /healthz")); got.Verdict != Deny {
		t.Errorf("no policy loaded: %+v, want denied", got)
	}
}

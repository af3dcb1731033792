package k8s

import (
	"net/netip"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/weirnet/weir/internal/k8s/apis/weirv1alpha1"
	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/policy"
)

// deathstarPolicy is the API-aware filtering study's policy as a user
// writes it: landing allowed, everything else on port 80 refused; the
// path match of the second rule leaves its type to the default.
const deathstarPolicy = `
apiVersion: weir.io/v1alpha1
kind: WeirNetworkPolicy
metadata:
  name: deathstar
  namespace: empire
spec:
  podSelector:
    matchLabels: {class: deathstar}
  ingress:
  - from:
    - podSelector:
        matchLabels: {org: empire}
    ports:
    - port: 80
      http:
      - method: POST
        path: {type: Exact, value: /v1/request-landing}
      - method: GET
        path: {value: /v1/status}
        hostnames: ["*.empire.svc"]
        headers:
        - {name: X-Fleet, type: Present}
    - port: 9090
`

func TestWeirNetworkPolicyToPolicy(t *testing.T) {
	var w weirv1alpha1.WeirNetworkPolicy
	if err := yaml.UnmarshalStrict([]byte(deathstarPolicy), &w); err != nil {
		t.Fatal(err)
	}
	np, h := WeirNetworkPolicyToPolicy(&w)
	if np.Namespace != "empire" || np.Name != "deathstar" || len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].Ports) != 2 ||
		np.Spec.Ingress[0].Ports[0].Port.IntValue() != 80 || len(np.Spec.Ingress[0].From) != 1 {
		t.Fatalf("the NetworkPolicy part: %+v", np.Spec)
	}
	if len(h.Ingress) != 1 || len(h.Ingress[0]) != 2 || len(h.Ingress[0][0]) != 2 || len(h.Ingress[0][1]) != 0 {
		t.Fatalf("HTTP rules by rule and port: %+v", h.Ingress)
	}
	status := h.Ingress[0][0][1]
	if status.Path.Type != l7.PathPrefix || status.Path.Value != "/v1/status" || status.Headers[0].Type != l7.HeaderPresent ||
		status.Hostnames[0] != "*.empire.svc" {
		t.Fatalf("defaults and fields of the second rule: %+v", status)
	}
	// The original keeps its rules: the conversion copies.
	if len(w.Spec.Ingress[0].Ports[0].HTTP) != 2 {
		t.Fatal("the conversion changed the object")
	}

	// Compiled with a pod of each kind: what a request gets.
	s := &policy.Snapshot{
		Namespaces: map[string]policy.Namespace{"empire": {Name: "empire"}},
		Pods: []policy.Pod{
			{Namespace: "empire", Name: "deathstar", Labels: map[string]string{"class": "deathstar"}, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.2")}, Local: true},
			{Namespace: "empire", Name: "tiefighter", Labels: map[string]string{"org": "empire"}, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.3")}},
		},
		Identities: map[string]policy.Identity{},
		Policies:   []*networkingv1.NetworkPolicy{np},
		HTTP:       map[*networkingv1.NetworkPolicy]*policy.PolicyHTTP{np: h},
	}
	for _, p := range s.Pods {
		s.Identities[policy.IdentityLabels(policy.Namespace{Name: p.Namespace}, p.Labels).Key()] = policy.MinClusterIdentity + policy.Identity(len(s.Identities))
	}
	res := policy.NewCompiler().Compile(s)
	if len(res.Errors) > 0 {
		t.Fatal(res.Errors)
	}
	tie := netip.MustParseAddr("10.0.0.3")
	for _, tc := range []struct {
		head    string
		port    uint16
		allowed bool
	}{
		{"POST /v1/request-landing HTTP/1.1\r\nHost: deathstar\r\n\r\n", 80, true},
		{"PUT /v1/exhaust-port HTTP/1.1\r\nHost: deathstar\r\n\r\n", 80, false},
		{"GET /v1/status/x HTTP/1.1\r\nHost: deathstar.empire.svc\r\nX-Fleet: 1\r\n\r\n", 80, true},
		{"GET /v1/status HTTP/1.1\r\nHost: deathstar.empire.svc\r\n\r\n", 80, false},
		{"PUT /v1/exhaust-port HTTP/1.1\r\nHost: deathstar\r\n\r\n", 9090, true}, // no HTTP rules on 9090
	} {
		reqs, err := l7.NewParser(l7.Limits{}).Feed([]byte(tc.head))
		if err != nil {
			t.Fatal(err)
		}
		got, err := res.LookupHTTP("empire/deathstar", policy.Ingress, tie, tc.port, reqs[0])
		if err != nil || got.Allowed != tc.allowed {
			t.Errorf("%q on port %d: allowed %v (%v), want %v", tc.head, tc.port, got.Allowed, err, tc.allowed)
		}
	}
}

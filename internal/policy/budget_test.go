package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
)

// ipBlockIngress allows ingress of the pods with app=app from cidr except
// the excepts, on TCP 80.
func ipBlockIngress(ns, name, app, cidr string, excepts ...string) *networkingv1.NetworkPolicy {
	return np(ns, name, map[string]string{"app": app}, []string{"Ingress"}, func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: excepts}}},
			Ports: []networkingv1.NetworkPolicyPort{tcp(80)},
		}}
	})
}

// TestCIDRBudgetRefusesTheOverflowingPolicy: one namespace's policy with
// more ipBlock prefixes than the node has room for is refused whole, and
// its subjects fail closed; the other namespace's policy keeps its exact
// verdicts, except included, whatever the names' order.
func TestCIDRBudgetRefusesTheOverflowingPolicy(t *testing.T) {
	var excepts []string
	for i := 0; i < 40; i++ {
		excepts = append(excepts, fmt.Sprintf("203.0.113.%d/32", i))
	}
	// "aaa" sorts first by name; it is still the one refused.
	hog := ipBlockIngress("x", "aaa-hog", "b", "203.0.113.0/24", excepts...)
	fair := ipBlockIngress("x", "zzz-fair", "a", "198.51.100.0/24", "198.51.100.7/32")
	c := NewCompiler()
	c.MaxCIDRs = 16
	res := c.Compile(fixture(hog, fair))
	if len(res.Errors) != 1 || !errors.Is(res.Errors[0], ErrPolicyTooLarge) || !strings.Contains(res.Errors[0].Error(), "x/aaa-hog") {
		t.Fatalf("errors %v, want x/aaa-hog refused with ErrPolicyTooLarge", res.Errors)
	}
	if len(res.CIDRs) > c.MaxCIDRs {
		t.Fatalf("%d CIDR identities, more than the budget of %d", len(res.CIDRs), c.MaxCIDRs)
	}
	for _, p := range []probe{
		{"x/a", Ingress, "198.51.100.9", ProtoTCP, 80, true},
		{"x/a", Ingress, "198.51.100.7", ProtoTCP, 80, false},  // the except holds
		{"x/b", Ingress, "203.0.113.200", ProtoTCP, 80, false}, // refused: closed
		{"x/b", Ingress, "10.0.0.1", ProtoTCP, 80, false},
		{"x/b", Ingress, "192.168.0.1", ProtoTCP, 80, true}, // the node still reaches it
	} {
		if got := res.Lookup(p.pod, p.dir, netip.MustParseAddr(p.peer), p.proto, p.port).Allowed(); got != p.allow {
			t.Errorf("%s %v from %s: allowed %v, want %v", p.pod, p.dir, p.peer, got, p.allow)
		}
	}
	// With room for both, both compile.
	c.MaxCIDRs = 0
	if res := c.Compile(fixture(hog, fair)); len(res.Errors) != 0 {
		t.Fatalf("unbounded: errors %v", res.Errors)
	}
}

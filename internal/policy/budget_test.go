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

// TestKeyBudgetRefusesTheNamespaceThatWouldFillTheMap: a namespace whose
// policies need more policy keys than the node has room for has its
// NetworkPolicies refused, its subjects closed; the other namespace keeps
// exactly the verdicts it has without the hog, whatever the names' order.
func TestKeyBudgetRefusesTheNamespaceThatWouldFillTheMap(t *testing.T) {
	var ports []networkingv1.NetworkPolicyPort
	for p := 1; p <= 300; p += 2 { // odd ports: one key each
		ports = append(ports, tcp(p))
	}
	// Namespace "a" sorts first by name; it is still the one refused.
	hog := np("a", "many-ports", map[string]string{"app": "h"}, []string{"Ingress"}, func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{Ports: ports}}
	})
	fair := ipBlockIngress("x", "fair", "a", "198.51.100.0/24", "198.51.100.7/32")
	snapshot := func(policies ...*networkingv1.NetworkPolicy) *Snapshot {
		s := fixture(policies...)
		s.Namespaces["a"] = Namespace{Name: "a", Labels: map[string]string{"kubernetes.io/metadata.name": "a"}}
		s.Pods = append(s.Pods, Pod{Namespace: "a", Name: "h", Labels: map[string]string{"app": "h"}, IPs: addrs("10.0.0.9"), Local: true})
		s.Identities[IdentityLabels(s.namespace("a"), map[string]string{"app": "h"}).Key()] = MinClusterIdentity + 50
		return s
	}
	alone := NewCompiler().Compile(snapshot(fair))

	c := NewCompiler()
	c.MaxKeys = 50
	res := c.Compile(snapshot(hog, fair))
	if len(res.Errors) != 1 || !errors.Is(res.Errors[0], ErrPolicyTooLarge) || !strings.Contains(res.Errors[0].Error(), "a/many-ports") {
		t.Fatalf("errors %v, want a/many-ports refused with ErrPolicyTooLarge", res.Errors)
	}
	if n := res.keyCount(); n > c.MaxKeys {
		t.Fatalf("%d keys, more than the budget of %d", n, c.MaxKeys)
	}
	if got, want := res.Endpoints["x/a"].Entries, alone.Endpoints["x/a"].Entries; len(got) != len(want) {
		t.Errorf("x/a holds %d keys, %d without the hog", len(got), len(want))
	}
	for _, p := range []probe{
		{"x/a", Ingress, "198.51.100.9", ProtoTCP, 80, true},
		{"x/a", Ingress, "198.51.100.7", ProtoTCP, 80, false}, // the except holds
		{"a/h", Ingress, "10.0.0.1", ProtoTCP, 1, false},      // refused: closed
		{"a/h", Ingress, "192.168.0.1", ProtoTCP, 1, true},    // the node still reaches it
	} {
		if got := res.Lookup(p.pod, p.dir, netip.MustParseAddr(p.peer), p.proto, p.port).Allowed(); got != p.allow {
			t.Errorf("%s %v from %s: allowed %v, want %v", p.pod, p.dir, p.peer, got, p.allow)
		}
	}
	// With room for both, both compile.
	c.MaxKeys = 0
	if res := c.Compile(snapshot(hog, fair)); len(res.Errors) != 0 || res.Lookup("a/h", Ingress, netip.MustParseAddr("10.0.0.1"), ProtoTCP, 1).Allowed() != true {
		t.Fatalf("unbounded: errors %v", res.Errors)
	}
}

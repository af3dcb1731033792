package agent

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	"github.com/weirnet/weir/internal/policy"
)

// TestPolicyEventsWarnOncePerMessage: a refused NetworkPolicy gets a
// Warning event naming the node and the reason, once while the refusal
// stands; a policy that loads again, or a new reason, speaks again.
func TestPolicyEventsWarnOncePerMessage(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	pe := policyEvents{rec: rec, node: "n1"}
	pol := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "hog"}}
	tooLarge := []error{&policy.NetworkPolicyError{Namespace: "x", Name: "hog",
		Err: errors.Join(errors.New("its ipBlocks need 40000 more CIDR entries, 100 of 32768 are left"), policy.ErrPolicyTooLarge)},
		errors.New("clusternetworkpolicy y: not a NetworkPolicy's")}
	next := func() string {
		select {
		case e := <-rec.Events:
			return e
		default:
			return ""
		}
	}
	pe.report([]*networkingv1.NetworkPolicy{pol}, nil, tooLarge)
	if e := next(); !strings.HasPrefix(e, "Warning PolicyTooLarge node n1 cannot load this policy") || !strings.Contains(e, "40000") {
		t.Fatalf("event %q, want a PolicyTooLarge warning from n1", e)
	}
	if e := next(); e != "" {
		t.Fatalf("a second event %q for one error", e)
	}
	pe.report([]*networkingv1.NetworkPolicy{pol}, nil, tooLarge)
	if e := next(); e != "" {
		t.Fatalf("the same refusal warned again: %q", e)
	}
	pe.report([]*networkingv1.NetworkPolicy{pol}, nil, nil) // loads
	pe.report([]*networkingv1.NetworkPolicy{pol}, nil, tooLarge)
	if e := next(); !strings.Contains(e, "PolicyTooLarge") {
		t.Fatalf("after loading in between, event %q, want the warning again", e)
	}
	invalid := []error{&policy.NetworkPolicyError{Namespace: "x", Name: "hog", Err: policy.ErrInvalidPolicy}}
	pe.report([]*networkingv1.NetworkPolicy{pol}, nil, invalid)
	if e := next(); !strings.HasPrefix(e, "Warning PolicyNotLoaded") {
		t.Fatalf("event %q, want PolicyNotLoaded", e)
	}
}

// TestPolicyEventsNameTheKind: a NetworkPolicy and a WeirNetworkPolicy of
// one name each get the events of their own errors, the WeirNetworkPolicy
// as itself, not as the NetworkPolicy it is read as.
func TestPolicyEventsNameTheKind(t *testing.T) {
	rec := record.NewFakeRecorder(10)
	rec.IncludeObject = true
	pe := policyEvents{rec: rec, node: "n1"}
	meta := metav1.ObjectMeta{Namespace: "x", Name: "web"}
	np := &networkingv1.NetworkPolicy{TypeMeta: metav1.TypeMeta{Kind: "NetworkPolicy", APIVersion: "networking.k8s.io/v1"}, ObjectMeta: meta}
	weir := &networkingv1.NetworkPolicy{ObjectMeta: meta} // as k8s.WeirNetworkPolicyToPolicy makes it
	policies := []*networkingv1.NetworkPolicy{np, weir}
	http := map[*networkingv1.NetworkPolicy]*policy.PolicyHTTP{weir: {}}
	weirErr := &policy.NetworkPolicyError{Namespace: "x", Name: "web", Kind: policy.KindWeirNetworkPolicy,
		Err: fmt.Errorf("ingress[0]: ports[0]: HTTP rules on a UDP port: %w", policy.ErrInvalidPolicy)}
	npErr := &policy.NetworkPolicyError{Namespace: "x", Name: "web", Err: policy.ErrInvalidPolicy}
	events := func() []string {
		var out []string
		for {
			select {
			case e := <-rec.Events:
				out = append(out, e)
			default:
				return out
			}
		}
	}

	pe.report(policies, http, []error{weirErr})
	got := events()
	if len(got) != 1 || !strings.Contains(got[0], "UDP port") ||
		!strings.HasSuffix(got[0], "involvedObject{kind=WeirNetworkPolicy,apiVersion=weir.io/v1alpha1}") {
		t.Fatalf("events %q, want one on the WeirNetworkPolicy", got)
	}
	// The NetworkPolicy's own error is another policy's: it speaks too,
	// on the NetworkPolicy, and the WeirNetworkPolicy's does not repeat.
	pe.report(policies, http, []error{npErr, weirErr})
	got = events()
	if len(got) != 1 || !strings.HasSuffix(got[0], "involvedObject{kind=NetworkPolicy,apiVersion=networking.k8s.io/v1}") {
		t.Fatalf("events %q, want one on the NetworkPolicy", got)
	}
	// Read as a NetworkPolicy (no HTTP entry), the same object's error
	// finds no WeirNetworkPolicy to speak on.
	pe.report(policies, nil, []error{&policy.NetworkPolicyError{Namespace: "x", Name: "web", Kind: policy.KindWeirNetworkPolicy, Err: errors.New("other")}})
	if got := events(); len(got) != 0 {
		t.Fatalf("events %q for a WeirNetworkPolicy the snapshot does not have", got)
	}
}

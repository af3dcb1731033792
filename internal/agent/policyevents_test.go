package agent

import (
	"errors"
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
	pe.report([]*networkingv1.NetworkPolicy{pol}, tooLarge)
	if e := next(); !strings.HasPrefix(e, "Warning PolicyTooLarge node n1 cannot load this policy") || !strings.Contains(e, "40000") {
		t.Fatalf("event %q, want a PolicyTooLarge warning from n1", e)
	}
	if e := next(); e != "" {
		t.Fatalf("a second event %q for one error", e)
	}
	pe.report([]*networkingv1.NetworkPolicy{pol}, tooLarge)
	if e := next(); e != "" {
		t.Fatalf("the same refusal warned again: %q", e)
	}
	pe.report([]*networkingv1.NetworkPolicy{pol}, nil) // loads
	pe.report([]*networkingv1.NetworkPolicy{pol}, tooLarge)
	if e := next(); !strings.Contains(e, "PolicyTooLarge") {
		t.Fatalf("after loading in between, event %q, want the warning again", e)
	}
	invalid := []error{&policy.NetworkPolicyError{Namespace: "x", Name: "hog", Err: policy.ErrInvalidPolicy}}
	pe.report([]*networkingv1.NetworkPolicy{pol}, invalid)
	if e := next(); !strings.HasPrefix(e, "Warning PolicyNotLoaded") {
		t.Fatalf("event %q, want PolicyNotLoaded", e)
	}
}

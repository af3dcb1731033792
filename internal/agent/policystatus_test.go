package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/policy"
)

func TestClusterAcks(t *testing.T) {
	cnp := &policy.ClusterPolicy{Kind: policy.KindClusterNetworkPolicy, Name: "a", Generation: 3}
	wcnp := &policy.ClusterPolicy{Kind: policy.KindWeirClusterNetworkPolicy, Name: "a", Generation: 1}
	long := strings.Repeat("x", 2*maxAckError)
	for _, tc := range []struct {
		name string
		errs []error
		want map[string]k8s.PolicyAck
	}{
		{"compiled", nil, map[string]k8s.PolicyAck{
			"ClusterNetworkPolicy/a": {Generation: 3}, "WeirClusterNetworkPolicy/a": {Generation: 1}}},
		{"errors go to their policy", []error{
			fmt.Errorf("%s: priority 2000: want 0 to 1000: %w", cnp.Ref(), policy.ErrInvalidPolicy),
			errors.New("networkpolicy default/x: bad port"),
			fmt.Errorf("%s: egress rule 2: %w", cnp.Ref(), policy.ErrInvalidPolicy),
		}, map[string]k8s.PolicyAck{
			"ClusterNetworkPolicy/a": {Generation: 3, Error: "priority 2000: want 0 to 1000: " + policy.ErrInvalidPolicy.Error() +
				"; egress rule 2: " + policy.ErrInvalidPolicy.Error()},
			"WeirClusterNetworkPolicy/a": {Generation: 1}}},
		{"long errors are cut", []error{fmt.Errorf("%s: %s", wcnp.Ref(), long)}, map[string]k8s.PolicyAck{
			"ClusterNetworkPolicy/a":     {Generation: 3},
			"WeirClusterNetworkPolicy/a": {Generation: 1, Error: long[:maxAckError-3] + "..."}}},
	} {
		if got := clusterAcks([]*policy.ClusterPolicy{cnp, wcnp}, tc.errs); !maps.Equal(got, tc.want) {
			t.Errorf("%s: acks %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestWeirPolicyAcks: every WeirNetworkPolicy compiled is acked with its
// generation under its namespaced key, and its own compile errors (not a
// NetworkPolicy's of the same name, nor another's) go with it.
func TestWeirPolicyAcks(t *testing.T) {
	wnp := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "empire", Name: "deathstar", Generation: 4}}
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "empire", Name: "deathstar", Generation: 9}}
	s := &policy.Snapshot{Policies: []*networkingv1.NetworkPolicy{np, wnp},
		HTTP: map[*networkingv1.NetworkPolicy]*policy.PolicyHTTP{wnp: {}}}
	errs := []error{
		&policy.NetworkPolicyError{Namespace: "empire", Name: "deathstar", Kind: policy.KindWeirNetworkPolicy,
			Err: fmt.Errorf("ingress[0]: HTTP rules on a UDP port: %w", policy.ErrInvalidPolicy)},
		&policy.NetworkPolicyError{Namespace: "empire", Name: "deathstar", Kind: policy.KindNetworkPolicy, Err: errors.New("not mine")},
		fmt.Errorf("wrapped: %w", &policy.NetworkPolicyError{Namespace: "empire", Name: "deathstar", Kind: policy.KindWeirNetworkPolicy,
			Err: errors.New("second")}),
	}
	want := map[string]k8s.PolicyAck{"WeirNetworkPolicy/empire/deathstar": {Generation: 4,
		Error: "ingress[0]: HTTP rules on a UDP port: " + policy.ErrInvalidPolicy.Error() + "; second"}}
	if got := weirPolicyAcks(s, errs); !maps.Equal(got, want) {
		t.Fatalf("acks %v, want %v", got, want)
	}
	a := &Agent{}
	a.ackPoliciesLocked(s, errs)
	if _, ok := a.policy.acks["WeirNetworkPolicy/empire/deathstar"]; !ok {
		t.Fatalf("the agent's acks %v lack the WeirNetworkPolicy", a.policy.acks)
	}
}

// TestAckSignalsOnlyChanges: recompiling the same policies asks for no
// report; a new generation asks for one, however many follow.
func TestAckSignalsOnlyChanges(t *testing.T) {
	a := &Agent{}
	a.policy.acked = make(chan struct{}, 1)
	p := &policy.ClusterPolicy{Kind: policy.KindClusterNetworkPolicy, Name: "a", Generation: 1}
	signalled := func() bool {
		select {
		case <-a.policy.acked:
			return true
		default:
			return false
		}
	}
	a.ackPoliciesLocked(&policy.Snapshot{ClusterPolicies: []*policy.ClusterPolicy{p}}, nil)
	if !signalled() {
		t.Fatal("first ack not signalled")
	}
	a.ackPoliciesLocked(&policy.Snapshot{ClusterPolicies: []*policy.ClusterPolicy{p}}, nil)
	if signalled() {
		t.Fatal("an unchanged ack signalled")
	}
	for gen := int64(2); gen < 5; gen++ {
		a.ackPoliciesLocked(&policy.Snapshot{ClusterPolicies: []*policy.ClusterPolicy{{Kind: p.Kind, Name: p.Name, Generation: gen}}}, nil)
	}
	if !signalled() || signalled() {
		t.Fatal("want one signal for a burst of changes")
	}
	if got := a.policy.acks["ClusterNetworkPolicy/a"].Generation; got != 4 {
		t.Fatalf("acked generation %d, want 4", got)
	}
}

// TestPolicyStatusLoopWritesOnReports: the elected agent's loop writes a
// policy's conditions once the caches hold the Node's report.
func TestPolicyStatusLoopWritesOnReports(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := json.Marshal(k8s.AgentState{Ready: true, Updated: time.Now().UTC(),
		ClusterPolicies: map[string]k8s.PolicyAck{"WeirClusterNetworkPolicy/p": {Generation: 4}}})
	if err != nil {
		t.Fatal(err)
	}
	kube := kubefake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1",
		Annotations: map[string]string{k8s.AgentAnnotation: string(st)}}})
	p := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": k8s.WeirClusterPolicyResource.GroupVersion().String(), "kind": policy.KindWeirClusterNetworkPolicy,
		"metadata": map[string]any{"name": "p", "generation": int64(4)},
		"spec":     map[string]any{"tier": "Admin", "priority": int64(1), "subject": map[string]any{"namespaces": map[string]any{}}},
	}}
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		k8s.IdentityResource:          "SecurityIdentityList",
		k8s.ClusterPolicyResource:     "ClusterNetworkPolicyList",
		k8s.WeirClusterPolicyResource: "WeirClusterNetworkPolicyList",
		k8s.WeirNetworkPolicyResource: "WeirNetworkPolicyList",
	}, p)
	w := k8s.NewWatcher(kube, dyn, "n1", 0)
	w.Start(ctx)
	a := &Agent{cfg: Config{NodeName: "n1"}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	stop := a.startPolicyStatus(ctx, w, dyn)
	defer stop()
	for {
		got, err := dyn.Resource(k8s.WeirClusterPolicyResource).Get(ctx, "p", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		if len(conds) == 2 {
			prog, _ := conds[1].(map[string]any)
			if prog["type"] != k8s.ConditionProgrammed || prog["status"] != "True" || prog["observedGeneration"] != int64(4) {
				t.Fatalf("conditions %v, want Programmed True at generation 4 second", conds)
			}
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("the loop never wrote the policy's status")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

package k8s

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/weirnet/weir/internal/k8s/apis/weirv1alpha1"
)

// reportingNode is a Node whose agent reported acks just now.
func reportingNode(t *testing.T, name string, acks map[string]PolicyAck) *corev1.Node {
	t.Helper()
	b, err := json.Marshal(AgentState{Ready: true, Updated: time.Now().UTC().Truncate(time.Second), ClusterPolicies: acks})
	if err != nil {
		t.Fatal(err)
	}
	n := node(name, "10.99.0.1", "10.244.0.0/24")
	n.Annotations = map[string]string{AgentAnnotation: string(b)}
	return n
}

// statusUpdates counts the status updates the client was asked for.
func statusUpdates(dyn *dynfake.FakeDynamicClient) int {
	n := 0
	for _, a := range dyn.Actions() {
		if a.GetVerb() == "update" && a.GetSubresource() == "status" {
			n++
		}
	}
	return n
}

func programmedOf(t *testing.T, dyn dynamic.Interface, p ClusterPolicyObject) (*metav1.Condition, *unstructured.Unstructured) {
	t.Helper()
	conds, u := conditionsOf(t, dyn, p)
	return meta.FindStatusCondition(conds, ConditionProgrammed), u
}

// conditionsOf reads p's status conditions as the API holds them.
func conditionsOf(t *testing.T, dyn dynamic.Interface, p ClusterPolicyObject) ([]metav1.Condition, *unstructured.Unstructured) {
	t.Helper()
	var res dynamic.ResourceInterface = dyn.Resource(policyKinds[p.Kind].gvr)
	if p.Namespace != "" {
		res = dyn.Resource(policyKinds[p.Kind].gvr).Namespace(p.Namespace)
	}
	u, err := res.Get(context.Background(), p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var st npav1alpha2.ClusterNetworkPolicyStatus
	if m, ok := u.Object["status"].(map[string]any); ok {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &st); err != nil {
			t.Fatal(err)
		}
	}
	return st.Conditions, u
}

// TestSyncPolicyStatus: only the elected node writes, it writes what
// changed and nothing else, and a conflict waits for the next round.
func TestSyncPolicyStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	both := map[string]PolicyAck{"ClusterNetworkPolicy/b-deny": {Generation: 3}, "WeirClusterNetworkPolicy/a-weir": {Generation: 7}}
	behind := map[string]PolicyAck{"ClusterNetworkPolicy/b-deny": {Generation: 3}, "WeirClusterNetworkPolicy/a-weir": {Generation: 6}}
	kube := fake.NewSimpleClientset(reportingNode(t, "n1", both), reportingNode(t, "n2", behind), node("n0", "10.99.0.9", "10.244.9.0/24"))
	dyn := newWatcherDynamic(weirPolicy(t, "a-weir", 7), upstreamPolicy(t, "b-deny", 3, npav1alpha2.ClusterNetworkPolicyRuleActionDeny))
	w := NewWatcher(kube, dyn, "n1", 0)
	changes := w.PolicyStatusChanges()
	w.Start(ctx)
	if err := w.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changes:
	case <-ctx.Done():
		t.Fatal("no status change signalled for the listed objects")
	}
	nodes := w.Nodes()
	if len(nodes) != 3 || nodes[0].Agent != nil || nodes[1].Agent == nil || nodes[1].Agent.ClusterPolicies["WeirClusterNetworkPolicy/a-weir"].Generation != 7 {
		t.Fatalf("nodes %+v: want n0 without an agent state, n1 with its acks", nodes)
	}
	policies := w.ClusterPolicyObjects()
	if len(policies) != 2 || policies[0].Ref() != "ClusterNetworkPolicy/b-deny" || policies[1].Generation != 7 {
		t.Fatalf("policies %+v", policies)
	}

	r, err := SyncPolicyStatus(ctx, dyn, "n2", nodes, policies, time.Now())
	if err != nil || r.Writer || statusUpdates(dyn) != 0 {
		t.Fatalf("n2: %+v, %v, %d updates; want no writer, no updates", r, err, statusUpdates(dyn))
	}
	r, err = SyncPolicyStatus(ctx, dyn, "n1", nodes, policies, time.Now())
	if err != nil || !r.Writer || r.Written != 2 || !r.Pending {
		t.Fatalf("n1: %+v, %v; want both written, a-weir pending", r, err)
	}
	deny, u := programmedOf(t, dyn, policies[0])
	// n0 never reported: programmed where an agent is, and n0 named.
	if deny == nil || deny.Status != metav1.ConditionTrue || deny.Reason != ReasonProgrammedOnReadyNodes || deny.ObservedGeneration != 3 ||
		!strings.HasPrefix(deny.Message, "programmed on 2/2 nodes with a ready weir-agent; unknown on n0 (no weir-agent report)") {
		t.Fatalf("b-deny Programmed %+v, want True on 2/2 ready nodes at generation 3, n0 named", deny)
	}
	if p, _, _ := unstructured.NestedInt64(u.Object, "spec", "priority"); p != 10 {
		t.Fatalf("b-deny spec priority %d after the status update, want 10 kept", p)
	}
	if weir, _ := programmedOf(t, dyn, policies[1]); weir == nil || weir.Reason != ReasonPending ||
		weir.Message != "programmed on 1/2 nodes; waiting for n2 (generation 6)" {
		t.Fatalf("a-weir Programmed %+v, want Pending on n2", weir)
	}

	// Once the cache has the written status, the same reports write nothing.
	for {
		policies = w.ClusterPolicyObjects()
		if len(policies) == 2 && len(policies[0].Conditions) == 2 && len(policies[1].Conditions) == 2 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the written status never reached the cache")
		case <-time.After(20 * time.Millisecond):
		}
	}
	r, err = SyncPolicyStatus(ctx, dyn, "n1", nodes, policies, time.Now())
	if err != nil || r.Written != 0 || !r.Pending || statusUpdates(dyn) != 2 {
		t.Fatalf("unchanged: %+v, %v, %d updates; want nothing written, still pending", r, err, statusUpdates(dyn))
	}

	// n2 catches up, but the object changed under the writer: skipped,
	// pending, then written on the next round.
	nodes[2].Agent.ClusterPolicies = both
	conflict := true
	dyn.PrependReactor("update", WeirClusterPolicyResource.Resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		if conflict && a.GetSubresource() == "status" {
			return true, nil, apierrors.NewConflict(WeirClusterPolicyResource.GroupResource(), "a-weir", nil)
		}
		return false, nil, nil
	})
	r, err = SyncPolicyStatus(ctx, dyn, "n1", nodes, policies, time.Now())
	if err != nil || r.Written != 0 || !r.Pending {
		t.Fatalf("conflict: %+v, %v; want skipped and pending, no error", r, err)
	}
	conflict = false
	r, err = SyncPolicyStatus(ctx, dyn, "n1", nodes, policies, time.Now())
	if err != nil || r.Written != 1 || r.Pending {
		t.Fatalf("after the conflict: %+v, %v; want a-weir written, nothing pending", r, err)
	}
	if weir, _ := programmedOf(t, dyn, policies[1]); weir == nil || weir.Status != metav1.ConditionTrue {
		t.Fatalf("a-weir Programmed %+v, want True", weir)
	}
}

// TestSyncWeirNetworkPolicyStatus: a WeirNetworkPolicy gets the cluster
// policies' conditions, in its namespace: Accepted and Programmed False
// with the error a node reports for its generation, True once none does.
func TestSyncWeirNetworkPolicyStatus(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wnp := &weirv1alpha1.WeirNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "empire", Name: "deathstar", Generation: 2}}
	wnp.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"class": "deathstar"}}
	ref := WeirPolicyRef("empire", "deathstar")
	bad := map[string]PolicyAck{ref: {Generation: 2, Error: "ingress[0]: ports[0]: HTTP rules on a UDP port"}}
	kube := fake.NewSimpleClientset(reportingNode(t, "n1", bad))
	dyn := newWatcherDynamic(asUnstructured(t, wnp, weirv1alpha1.SchemeGroupVersion.WithKind("WeirNetworkPolicy")))
	w := NewWatcher(kube, dyn, "n1", 0)
	w.Start(ctx)
	if err := w.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	policies := w.ClusterPolicyObjects()
	if len(policies) != 1 || policies[0].Ref() != "WeirNetworkPolicy/empire/deathstar" || policies[0].Generation != 2 {
		t.Fatalf("policies %+v, want the WeirNetworkPolicy", policies)
	}
	conditions := func() []metav1.Condition {
		t.Helper()
		conds, _ := conditionsOf(t, dyn, policies[0])
		return conds
	}
	r, err := SyncPolicyStatus(ctx, dyn, "n1", w.Nodes(), policies, time.Now())
	if err != nil || r.Written != 1 {
		t.Fatalf("round: %+v, %v; want the policy written", r, err)
	}
	got := conditions()
	accepted := meta.FindStatusCondition(got, ConditionAccepted)
	if accepted == nil || accepted.Status != metav1.ConditionFalse || accepted.Reason != ReasonInvalid ||
		accepted.Message != "ingress[0]: ports[0]: HTTP rules on a UDP port" || accepted.ObservedGeneration != 2 {
		t.Fatalf("Accepted %+v, want False with the node's error at generation 2", accepted)
	}

	nodes := w.Nodes()
	nodes[0].Agent.ClusterPolicies = map[string]PolicyAck{ref: {Generation: 2}}
	policies[0].Conditions = got
	if r, err = SyncPolicyStatus(ctx, dyn, "n1", nodes, policies, time.Now()); err != nil || r.Written != 1 || r.Pending {
		t.Fatalf("fixed: %+v, %v; want written, nothing pending", r, err)
	}
	got = conditions()
	if c := meta.FindStatusCondition(got, ConditionAccepted); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("Accepted %+v, want True", c)
	}
	if c := meta.FindStatusCondition(got, ConditionProgrammed); c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonProgrammedOnAllNodes {
		t.Fatalf("Programmed %+v, want True on all nodes", c)
	}
}

package k8s

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"
	"sigs.k8s.io/yaml"

	"github.com/weirnet/weir/internal/k8s/apis/weirv1alpha1"
	"github.com/weirnet/weir/internal/policy"
)

func node(name, ip, cidr string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: ip}}},
	}
}

func pod(ns, name, nodeName, ip string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels, UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{
			Name: "c", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {ContainerPort: 53, Protocol: corev1.ProtocolUDP}},
		}}},
		Status: corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: ip}}},
	}
}

func TestWatcherSnapshotsNodesAndOwnPods(t *testing.T) {
	labelled := node("n1", "10.99.0.11", "10.244.0.0/24")
	labelled.Labels = map[string]string{"role": "dns"}
	c := fake.NewSimpleClientset(
		node("n2", "10.99.0.12", "10.244.1.0/24"), labelled,
		pod("default", "web", "n1", "10.244.0.5", map[string]string{"app": "web"}),
		pod("default", "other", "n2", "10.244.1.5", nil),
	)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dyn := newWatcherDynamic(identityObject(300, policy.Labels{policy.LabelNamespace + "=default", "k8s:app=web"}))
	w := NewWatcher(c, dyn, "n1", 0)
	w.Start(ctx)
	if err := w.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	s := w.Snapshot()
	if len(s.Nodes) != 2 || s.Nodes[0].Name != "n1" {
		t.Fatalf("nodes %+v, want n1 and n2 sorted", s.Nodes)
	}
	n1, ok := s.Node("n1")
	cidr, has := n1.PodCIDR4()
	if !ok || !has || cidr != netip.MustParsePrefix("10.244.0.0/24") || n1.InternalIP != netip.MustParseAddr("10.99.0.11") ||
		n1.Labels["role"] != "dns" {
		t.Fatalf("n1 = %+v", n1)
	}
	if len(s.Pods) != 1 || s.Pods[0].Name != "web" || s.Pods[0].Labels["app"] != "web" {
		t.Fatalf("pods %+v, want only this node's web pod", s.Pods)
	}
	if len(s.ClusterPods) != 2 || s.ClusterPods[0].Name != "other" || s.ClusterPods[0].NodeName != "n2" {
		t.Fatalf("cluster pods %+v, want both, sorted, with their node", s.ClusterPods)
	}
	if got := s.Identities[policy.LabelNamespace+"=default\nk8s:app=web"]; got != 300 {
		t.Fatalf("identities %v, want the web label set at 300", s.Identities)
	}
	want := []ContainerPort{{Name: "http", Port: 8080, Protocol: "TCP"}, {Port: 53, Protocol: "UDP"}}
	if got := s.Pods[0].Ports; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("ports %+v, want %+v (protocol defaults to TCP)", got, want)
	}

	// A new node arrives: one signal, and the next snapshot has it.
	drain(w)
	if _, err := c.CoreV1().Nodes().Create(ctx, node("n3", "10.99.0.13", "10.244.2.0/24"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Changes():
	case <-ctx.Done():
		t.Fatal("no change signalled for a new node")
	}
	waitNodes(t, w, 3)
}

func drain(w *Watcher) {
	for {
		select {
		case <-w.Changes():
		default:
			return
		}
	}
}

func waitNodes(t *testing.T, w *Watcher, n int) {
	t.Helper()
	for i := 0; i < 100; i++ {
		if len(w.Snapshot().Nodes) == n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("snapshot never had %d nodes", n)
}

func TestNodeWithoutCIDROrAddressIsIncomplete(t *testing.T) {
	n := nodeFrom(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: corev1.NodeSpec{PodCIDR: "not-a-cidr"}})
	if _, ok := n.PodCIDR4(); ok || n.InternalIP.IsValid() {
		t.Fatalf("%+v: a malformed CIDR and no address must leave both unset", n)
	}
}

func TestReportNodeSetsConditionAndAnnotation(t *testing.T) {
	c := fake.NewSimpleClientset(node("n1", "10.99.0.11", "10.244.0.0/24"))
	ctx := context.Background()
	if err := ReportNode(ctx, c, "n1", AgentState{Ready: true, Mode: "vxlan", PodCIDR: "10.244.0.0/24", Peers: 1}); err != nil {
		t.Fatal(err)
	}
	n, err := c.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var st AgentState
	if err := json.Unmarshal([]byte(n.Annotations[AgentAnnotation]), &st); err != nil || !st.Ready || st.Mode != "vxlan" {
		t.Fatalf("annotation %q: %v", n.Annotations[AgentAnnotation], err)
	}
	var found bool
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeNetworkUnavailable {
			found = true
			if cond.Status != corev1.ConditionFalse || cond.Reason != ConditionReason {
				t.Fatalf("condition %+v, want NetworkUnavailable=False by %s", cond, ConditionReason)
			}
		}
	}
	if !found {
		t.Fatalf("no NetworkUnavailable condition in %+v", n.Status.Conditions)
	}
	if err := ReportNode(ctx, c, "gone", AgentState{}); err == nil {
		t.Fatal("reporting on a missing node must fail")
	}
}

// TestPodMemoFollowsResourceVersions: an unchanged pod keeps its
// conversion, a new resource version (or none, as from fake clients) is
// read again, and a pod gone from the cache is forgotten.
func TestPodMemoFollowsResourceVersions(t *testing.T) {
	m := podMemo{byID: map[types.UID]memoPod{}}
	p := pod("default", "web", "n1", "10.244.0.5", map[string]string{"app": "web"})
	p.ResourceVersion = "7"
	first := m.convert(p, map[types.UID]bool{})
	p.Labels = map[string]string{"app": "api"} // as if mutated in place: same version, kept
	if got := m.convert(p, map[types.UID]bool{}); got.pod.Labels["app"] != "web" {
		t.Fatalf("same resource version reconverted: labels %v", got.pod.Labels)
	}
	p.ResourceVersion = "8"
	if got := m.convert(p, map[types.UID]bool{}); got.pod.Labels["app"] != "api" || got.key != first.key {
		t.Fatalf("new resource version not reconverted: %+v", got)
	}
	p.ResourceVersion = ""
	p.Labels = map[string]string{"app": "db"}
	if got := m.convert(p, map[types.UID]bool{}); got.pod.Labels["app"] != "db" {
		t.Fatalf("a pod without a resource version must be reconverted: %v", got.pod.Labels)
	}
	m.prune(map[types.UID]bool{})
	if len(m.byID) != 0 {
		t.Fatalf("prune kept %d pods no longer in the cache", len(m.byID))
	}
}

// newWatcherDynamic is a fake dynamic client that lists every custom
// resource the watcher watches.
func newWatcherDynamic(objs ...runtime.Object) *dynfake.FakeDynamicClient {
	return dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		IdentityResource:          "SecurityIdentityList",
		ClusterPolicyResource:     "ClusterNetworkPolicyList",
		WeirClusterPolicyResource: "WeirClusterNetworkPolicyList",
		WeirNetworkPolicyResource: "WeirNetworkPolicyList",
	}, objs...)
}

// asUnstructured is o as a dynamic client holds it.
func asUnstructured(t *testing.T, o runtime.Object, gvk schema.GroupVersionKind) *unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(gvk)
	return u
}

var everyNamespace = &metav1.LabelSelector{}

func upstreamPolicy(t *testing.T, name string, generation int64, action npav1alpha2.ClusterNetworkPolicyRuleAction) *unstructured.Unstructured {
	p := &npav1alpha2.ClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: generation},
		Spec: npav1alpha2.ClusterNetworkPolicySpec{
			Tier: npav1alpha2.AdminTier, Priority: 10,
			Subject: npav1alpha2.ClusterNetworkPolicySubject{Namespaces: everyNamespace},
			Ingress: []npav1alpha2.ClusterNetworkPolicyIngressRule{{
				Name: "in", Action: action,
				From: []npav1alpha2.ClusterNetworkPolicyIngressPeer{{Namespaces: everyNamespace}},
			}},
		},
	}
	return asUnstructured(t, p, npav1alpha2.SchemeGroupVersion.WithKind("ClusterNetworkPolicy"))
}

// weirPolicy rejects all ingress and logs DNS to the nodes labelled
// role=dns.
func weirPolicy(t *testing.T, name string, generation int64) *unstructured.Unstructured {
	p := &weirv1alpha1.WeirClusterNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: generation},
		Spec: weirv1alpha1.WeirClusterNetworkPolicySpec{
			Tier: npav1alpha2.BaselineTier, Priority: 5,
			Subject: npav1alpha2.ClusterNetworkPolicySubject{Namespaces: everyNamespace},
			Ingress: []weirv1alpha1.IngressRule{{
				Name: "reject-in", Action: weirv1alpha1.RuleActionReject,
				From: []npav1alpha2.ClusterNetworkPolicyIngressPeer{{Namespaces: everyNamespace}},
			}},
			Egress: []weirv1alpha1.EgressRule{{
				Name: "log-dns", Action: weirv1alpha1.RuleActionLog,
				To: []npav1alpha2.ClusterNetworkPolicyEgressPeer{{Nodes: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "dns"}}}},
				Protocols: []npav1alpha2.ClusterNetworkPolicyProtocol{{
					UDP: &npav1alpha2.ClusterNetworkPolicyProtocolUDP{DestinationPort: &npav1alpha2.Port{Number: 53}},
				}},
			}},
		},
	}
	return asUnstructured(t, p, weirv1alpha1.SchemeGroupVersion.WithKind("WeirClusterNetworkPolicy"))
}

// TestWatcherSnapshotsClusterPolicies: both kinds arrive in one sorted
// list in the upstream types, with their generations, and Weir's actions
// read back as the compiler reads them.
func TestWatcherSnapshotsClusterPolicies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dyn := newWatcherDynamic(weirPolicy(t, "a-weir", 7),
		upstreamPolicy(t, "b-deny", 3, npav1alpha2.ClusterNetworkPolicyRuleActionDeny),
		upstreamPolicy(t, "a-pass", 1, npav1alpha2.ClusterNetworkPolicyRuleActionPass))
	w := NewWatcher(fake.NewSimpleClientset(), dyn, "n1", 0)
	w.Start(ctx)
	if err := w.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	got := w.Snapshot().ClusterPolicies
	want := []struct {
		ref        string
		generation int64
		ingress    policy.Action
	}{
		{"ClusterNetworkPolicy/a-pass", 1, policy.ActionPass},
		{"ClusterNetworkPolicy/b-deny", 3, policy.ActionDeny},
		{"WeirClusterNetworkPolicy/a-weir", 7, policy.ActionReject},
	}
	if len(got) != len(want) {
		t.Fatalf("%d cluster policies, want %d", len(got), len(want))
	}
	for i, exp := range want {
		p := got[i]
		if p.Ref() != exp.ref || p.Generation != exp.generation || len(p.Spec.Ingress) != 1 {
			t.Fatalf("policy %d: %s generation %d, %d ingress rules; want %s generation %d, one rule",
				i, p.Ref(), p.Generation, len(p.Spec.Ingress), exp.ref, exp.generation)
		}
		if a, err := policy.ParseAction(p.Kind, string(p.Spec.Ingress[0].Action)); err != nil || a != exp.ingress {
			t.Fatalf("%s ingress action %q (%v), want %v", p.Ref(), p.Spec.Ingress[0].Action, err, exp.ingress)
		}
	}
	weir := got[2]
	if weir.Spec.Tier != npav1alpha2.BaselineTier || weir.Spec.Priority != 5 || len(weir.Spec.Egress) != 1 {
		t.Fatalf("weir spec %+v: want Baseline, priority 5, one egress rule", weir.Spec)
	}
	eg := weir.Spec.Egress[0]
	if eg.Name != "log-dns" || eg.Action != "Log" || len(eg.To) != 1 || eg.To[0].Nodes == nil ||
		eg.To[0].Nodes.MatchLabels["role"] != "dns" || len(eg.Protocols) != 1 || eg.Protocols[0].UDP == nil ||
		eg.Protocols[0].UDP.DestinationPort.Number != 53 {
		t.Fatalf("weir egress rule %+v: want log-dns, Log, to nodes role=dns, UDP 53", eg)
	}

	// A new policy of Weir's kind: one signal, and the next snapshot has it.
	drain(w)
	if _, err := dyn.Resource(WeirClusterPolicyResource).Create(ctx, weirPolicy(t, "b-weir", 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Changes():
	case <-ctx.Done():
		t.Fatal("no change signalled for a new WeirClusterNetworkPolicy")
	}
	for len(w.Snapshot().ClusterPolicies) != 4 {
		select {
		case <-ctx.Done():
			t.Fatal("the new policy never reached the snapshot")
		case <-time.After(20 * time.Millisecond):
		}
	}
	if last := w.Snapshot().ClusterPolicies[3]; last.Ref() != "WeirClusterNetworkPolicy/b-weir" {
		t.Fatalf("last policy %s, want WeirClusterNetworkPolicy/b-weir", last.Ref())
	}
}

// weirNetworkPolicy is deathstarPolicy in namespace ns, as a dynamic
// client holds it.
func weirNetworkPolicy(t *testing.T, ns string) *unstructured.Unstructured {
	t.Helper()
	var p weirv1alpha1.WeirNetworkPolicy
	if err := yaml.UnmarshalStrict([]byte(deathstarPolicy), &p); err != nil {
		t.Fatal(err)
	}
	p.Namespace = ns
	return asUnstructured(t, &p, weirv1alpha1.SchemeGroupVersion.WithKind(policy.KindWeirNetworkPolicy))
}

// TestWatcherSnapshotsWeirNetworkPolicies: a WeirNetworkPolicy reaches
// the snapshot's Policies as the NetworkPolicy it is read as, its HTTP
// rules in HTTP under that policy, after a NetworkPolicy of the same name
// and in namespace/name order with the rest; a new one is signalled.
func TestWatcherSnapshotsWeirNetworkPolicies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	np := func(ns, name string) *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	kube := fake.NewSimpleClientset(np("empire", "deathstar"), np("empire", "a-first"), np("rebels", "base"))
	dyn := newWatcherDynamic(weirNetworkPolicy(t, "empire"))
	w := NewWatcher(kube, dyn, "n1", 0)
	w.Start(ctx)
	if err := w.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	// Several snapshots: the caches list in map order, the snapshot never.
	for range 20 {
		s := w.Snapshot()
		want := []string{"empire/a-first", "empire/deathstar", policy.KindWeirNetworkPolicy + "/empire/deathstar", "rebels/base"}
		if got := policyRefs(s); !slices.Equal(got, want) {
			t.Fatalf("policies %v, want %v", got, want)
		}
	}
	s := w.Snapshot()
	weir := s.Policies[2]
	h := s.HTTP[weir]
	if len(s.HTTP) != 1 || h == nil || len(weir.Spec.Ingress) != 1 || len(weir.Spec.Ingress[0].Ports) != 2 {
		t.Fatalf("HTTP %v for %+v: want the WeirNetworkPolicy's rules alone", s.HTTP, weir.Spec)
	}
	if len(h.Ingress) != 1 || len(h.Ingress[0]) != 2 || len(h.Ingress[0][0]) != 2 || len(h.Ingress[0][1]) != 0 {
		t.Fatalf("HTTP rules by rule and port %+v: want two on port 80, none on 9090", h.Ingress)
	}
	if r := h.Ingress[0][0][0]; r.Method != "POST" || r.Path == nil || r.Path.Value != "/v1/request-landing" {
		t.Fatalf("first HTTP rule %+v: want POST /v1/request-landing", r)
	}

	drain(w)
	if _, err := dyn.Resource(WeirNetworkPolicyResource).Namespace("alderaan").Create(ctx, weirNetworkPolicy(t, "alderaan"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Changes():
	case <-ctx.Done():
		t.Fatal("no change signalled for a new WeirNetworkPolicy")
	}
	for len(w.Snapshot().HTTP) != 2 {
		select {
		case <-ctx.Done():
			t.Fatal("the new WeirNetworkPolicy never reached the snapshot")
		case <-time.After(20 * time.Millisecond):
		}
	}
	if first := policyRefs(w.Snapshot())[0]; first != policy.KindWeirNetworkPolicy+"/alderaan/deathstar" {
		t.Fatalf("first policy %s, want the new one, sorted by namespace", first)
	}
}

// policyRefs names a snapshot's policies in order, a WeirNetworkPolicy
// with its kind before it.
func policyRefs(s Snapshot) []string {
	var out []string
	for _, p := range s.Policies {
		ref := p.Namespace + "/" + p.Name
		if _, ok := s.HTTP[p]; ok {
			ref = policy.KindWeirNetworkPolicy + "/" + ref
		}
		out = append(out, ref)
	}
	return out
}

// TestWatcherSyncFailsOnMissingCRD: a kind the API server does not serve
// ends the wait with an error naming the manifest that installs it.
func TestWatcherSyncFailsOnMissingCRD(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dyn := newWatcherDynamic()
	dyn.PrependReactor("list", WeirClusterPolicyResource.Resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(WeirClusterPolicyResource.GroupResource(), "")
	})
	w := NewWatcher(fake.NewSimpleClientset(), dyn, "n1", 0)
	w.Start(ctx)
	err := w.WaitSynced(ctx)
	if !errors.Is(err, ErrCRDMissing) || !strings.Contains(err.Error(), "deploy/crd-weirclusternetworkpolicies.yaml") {
		t.Fatalf("WaitSynced: %v, want %v naming deploy/crd-weirclusternetworkpolicies.yaml", err, ErrCRDMissing)
	}
	if w.Synced() {
		t.Fatal("synced without the kind")
	}
}

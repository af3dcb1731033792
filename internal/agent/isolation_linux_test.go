package agent

import (
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/k8s"
)

// A pod's policy is in the datapath when its ADD returns, before the
// runtime starts its containers; without cluster state it stays closed.
func TestAddCompilesPolicyBeforeReturning(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "deny-web"}}
	deny.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
	deny.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	synced := true
	n.agent.snapshot = func() (k8s.Snapshot, bool) {
		pod := k8s.Pod{Namespace: "default", Name: "web", Labels: map[string]string{"app": "web"}, NodeName: "n1"}
		return k8s.Snapshot{
			Namespaces:  map[string]map[string]string{"default": {"kubernetes.io/metadata.name": "default"}},
			Pods:        []k8s.Pod{pod},
			ClusterPods: []k8s.Pod{pod},
			Policies:    []*networkingv1.NetworkPolicy{deny},
		}, synced
	}
	flagsOf := func(id string) ([2]bool, bool) {
		t.Helper()
		m, err := n.dp.PolicyEndpoints()
		if err != nil {
			t.Fatal(err)
		}
		f, ok := m[n.nodeLinks()[datapath.HostIfName(id, "eth0")]]
		return f, ok
	}

	if _, err := n.agent.Add(api.AddRequest{Attachment: api.Attachment{ContainerID: "web", IfName: "eth0"}, NetNS: n.newPod().Path(), PodNamespace: "default", PodName: "web"}); err != nil {
		t.Fatal(err)
	}
	if f, ok := flagsOf("web"); !ok || f != [2]bool{true, false} {
		t.Fatalf("after ADD: enforce %v (present %v), want ingress only, as deny-web says", f, ok)
	}

	synced = false // the API server has never been listed
	if _, err := n.agent.Add(api.AddRequest{Attachment: api.Attachment{ContainerID: "other", IfName: "eth0"}, NetNS: n.newPod().Path(), PodNamespace: "default", PodName: "other"}); err != nil {
		t.Fatal(err)
	}
	if f, ok := flagsOf("other"); !ok || f != [2]bool{true, true} {
		t.Fatalf("after ADD without cluster state: enforce %v (present %v), want closed both ways", f, ok)
	}

	for _, id := range []string{"web", "other"} {
		if err := n.agent.Del(api.DelRequest{Attachment: api.Attachment{ContainerID: id, IfName: "eth0"}}); err != nil {
			t.Fatal(err)
		}
	}
	if m, err := n.dp.PolicyEndpoints(); err != nil || len(m) != 0 {
		t.Fatalf("endpoint policy entries after DEL: %v (%v), want none", m, err)
	}
}

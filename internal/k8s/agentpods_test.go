package k8s

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// Every node gets an entry: its running agent pod, or why it has none;
// a pod that only carries the agent's label is no agent.
func TestAgentPodsNamesEveryNode(t *testing.T) {
	agent := func(name, node string, phase corev1.PodPhase, owned bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system",
			Labels: map[string]string{"app.kubernetes.io/name": "weir-agent"}},
			Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase}}
		if owned {
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "weir-agent", Controller: ptr.To(true)}}
		}
		return p
	}
	kube := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n3"}},
		agent("weir-agent-a", "n1", corev1.PodRunning, true),
		agent("weir-agent-b", "n2", corev1.PodPending, true),
		agent("impostor", "n3", corev1.PodRunning, false),
	)
	got, err := AgentPods(context.Background(), kube)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Node != "n1" || got[1].Node != "n2" || got[2].Node != "n3" {
		t.Fatalf("got %+v, want n1, n2, n3 in order", got)
	}
	if got[0].Err != nil || got[0].Pod != (PodRef{Namespace: "kube-system", Pod: "weir-agent-a", Container: AgentContainer}) {
		t.Errorf("n1: %+v, want its running agent pod", got[0])
	}
	if !errors.Is(got[1].Err, ErrNoAgentPod) || !strings.Contains(got[1].Err.Error(), "kube-system/weir-agent-b is Pending") {
		t.Errorf("n2: %v, want no running agent pod, naming the pending one", got[1].Err)
	}
	if !errors.Is(got[2].Err, ErrNoAgentPod) || got[2].Pod.Pod != "" {
		t.Errorf("n3: %+v, want no agent pod (the look-alike is none)", got[2])
	}
}

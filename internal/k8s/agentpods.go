package k8s

import (
	"context"
	"errors"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// AgentPodSelector selects the agent DaemonSet's pods (the chart's
// app.kubernetes.io/name label), in whatever namespace it was installed.
const AgentPodSelector = "app.kubernetes.io/name=weir-agent"

// AgentContainer is the agent's container in those pods.
const AgentContainer = "agent"

// MountFSContainer is the pods' privileged init container that makes
// Weir's mounts on the node (weir-agent mount-fs).
const MountFSContainer = "mount-fs"

// ErrNoAgentPod: a node runs no running Weir agent pod.
var ErrNoAgentPod = errors.New("no running weir-agent pod")

// AgentPod is the agent pod of one node, or why there is none.
type AgentPod struct {
	Node string
	Pod  PodRef
	// Err is set when the node has no running agent pod
	// (ErrNoAgentPod, with the pod's phase when it has one).
	Err error
}

// AgentPods finds every node's agent pod: one entry per node of the
// cluster, in node order, those without a running agent pod with Err.
func AgentPods(ctx context.Context, kube kubernetes.Interface) ([]AgentPod, error) {
	pods, err := kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: AgentPodSelector})
	if err != nil {
		return nil, fmt.Errorf("list agent pods (%s): %w", AgentPodSelector, err)
	}
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	byNode := map[string]AgentPod{}
	for _, n := range nodes.Items {
		byNode[n.Name] = AgentPod{Node: n.Name, Err: ErrNoAgentPod}
	}
	for _, p := range pods.Items {
		node := p.Spec.NodeName
		if node == "" || !ownedByDaemonSet(&p) {
			continue // not scheduled; not an agent DaemonSet's pod (a look-alike label)
		}
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			if prev, ok := byNode[node]; !ok || prev.Err != nil {
				byNode[node] = AgentPod{Node: node, Err: fmt.Errorf("%w: %s/%s is %s", ErrNoAgentPod, p.Namespace, p.Name, podState(&p))}
			}
			continue
		}
		byNode[node] = AgentPod{Node: node, Pod: PodRef{Namespace: p.Namespace, Pod: p.Name, Container: AgentContainer}}
	}
	out := make([]AgentPod, 0, len(byNode))
	for _, a := range byNode {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}

// podState is a pod's phase, or terminating.
func podState(p *corev1.Pod) string {
	if p.DeletionTimestamp != nil {
		return "terminating"
	}
	return string(p.Status.Phase)
}

// ownedByDaemonSet says whether a DaemonSet controls the pod.
func ownedByDaemonSet(p *corev1.Pod) bool {
	for _, o := range p.OwnerReferences {
		if o.Kind == "DaemonSet" && o.Controller != nil && *o.Controller {
			return true
		}
	}
	return false
}

package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// AgentAnnotation is the Node annotation where the agent states what it
// programmed, for operators and for `weir lab status`.
const AgentAnnotation = "weir.io/agent"

// ConditionReason is the reason the agent gives on NetworkUnavailable,
// the condition Kubernetes reserves for the network plugin.
const ConditionReason = "WeirAgentReady"

// AgentState is the annotation's content.
type AgentState struct {
	Ready     bool      `json:"ready"`
	Mode      string    `json:"mode"`
	PodCIDR   string    `json:"podCIDR"`
	Endpoints int       `json:"endpoints"`
	Peers     int       `json:"peers"`
	Updated   time.Time `json:"updated"`
	// ClusterPolicies says, by kind/name, which generation of each
	// cluster policy the node last loaded into its datapath.
	ClusterPolicies map[string]PolicyAck `json:"clusterPolicies,omitempty"`
}

// PolicyAck is one node's word on one cluster policy: the generation it
// programmed, and why that generation did not compile, if it did not
// (its subjects then fail closed). Warning is what the node enforces
// otherwise than the policy reads (a rule it judges more strictly), for
// an operator to see.
type PolicyAck struct {
	Generation int64  `json:"generation"`
	Error      string `json:"error,omitempty"`
	Warning    string `json:"warning,omitempty"`
}

// agentStateFrom reads a Node's AgentAnnotation; nil when it is absent
// or does not parse.
func agentStateFrom(annotations map[string]string) *AgentState {
	raw, ok := annotations[AgentAnnotation]
	if !ok {
		return nil
	}
	st := new(AgentState)
	if err := json.Unmarshal([]byte(raw), st); err != nil {
		return nil
	}
	return st
}

// ReportNode writes the agent's state on its Node: the annotation, and
// NetworkUnavailable=False once the datapath is programmed.
func ReportNode(ctx context.Context, client kubernetes.Interface, node string, st AgentState) error {
	ann, err := json.Marshal(st)
	if err != nil {
		return err
	}
	meta, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{AgentAnnotation: string(ann)}}})
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, meta, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("annotate node %s: %w", node, err)
	}
	status, msg := corev1.ConditionTrue, "weir-agent is not ready"
	if st.Ready {
		status, msg = corev1.ConditionFalse, "weir-agent programmed the node's datapath"
	}
	now := metav1.NewTime(time.Now())
	cond := map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type: corev1.NodeNetworkUnavailable, Status: status, Reason: ConditionReason, Message: msg,
		LastHeartbeatTime: now, LastTransitionTime: now,
	}}}}
	b, err := json.Marshal(cond)
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Nodes().PatchStatus(ctx, node, b); err != nil {
		return fmt.Errorf("set NetworkUnavailable on node %s: %w", node, err)
	}
	return nil
}

package k8s

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirnet/weir/internal/policy"
)

var statusNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// agentNode is a node whose agent reported at statusNow, ready, with acks
// of "ClusterNetworkPolicy/p" given as generation, error pairs.
func agentNode(name string, acks map[string]PolicyAck) Node {
	return Node{Name: name, Agent: &AgentState{Ready: true, Updated: statusNow.Add(-10 * time.Second), ClusterPolicies: acks}}
}

func ack(gen int64, err string) map[string]PolicyAck {
	return map[string]PolicyAck{"ClusterNetworkPolicy/p": {Generation: gen, Error: err}}
}

func TestPolicyConditions(t *testing.T) {
	stale := agentNode("a-stale", nil)
	stale.Agent.Updated = statusNow.Add(-AgentStale)
	notReady := agentNode("a-not-ready", nil)
	notReady.Agent.Ready = false
	many := []Node{agentNode("n0", ack(2, ""))}
	for i := 1; i <= 7; i++ {
		many = append(many, agentNode(fmt.Sprintf("n%d", i), ack(1, "")))
	}
	for _, tc := range []struct {
		name                 string
		nodes                []Node
		programmed, accepted metav1.ConditionStatus
		reason, message      string
		acceptedMessage      string
	}{
		{"every node at this generation", []Node{agentNode("n1", ack(2, "")), agentNode("n2", ack(2, ""))},
			metav1.ConditionTrue, metav1.ConditionTrue, ReasonProgrammedOnAllNodes, "programmed on 2/2 nodes", ""},
		{"a node behind, a node without it", []Node{agentNode("n1", ack(2, "")), agentNode("n3", nil), agentNode("n2", ack(1, ""))},
			metav1.ConditionFalse, metav1.ConditionTrue, ReasonPending, "programmed on 1/3 nodes; waiting for n2 (generation 1), n3 (none)", ""},
		{"more behind than are named", many,
			metav1.ConditionFalse, metav1.ConditionTrue, ReasonPending,
			"programmed on 1/8 nodes; waiting for n1 (generation 1), n2 (generation 1), n3 (generation 1), n4 (generation 1), n5 (generation 1) and 2 more", ""},
		{"an error on a node", []Node{agentNode("n1", ack(2, "")), agentNode("n2", ack(2, "priority 2000: want 0 to 1000")), agentNode("n3", ack(1, ""))},
			metav1.ConditionFalse, metav1.ConditionFalse, ReasonInvalid, "priority 2000: want 0 to 1000", "priority 2000: want 0 to 1000"},
		{"an error of an older generation is only lag", []Node{agentNode("n1", ack(2, "")), agentNode("n2", ack(1, "bad"))},
			metav1.ConditionFalse, metav1.ConditionTrue, ReasonPending, "programmed on 1/2 nodes; waiting for n2 (generation 1)", ""},
		{"nodes without a ready, current agent are named", []Node{stale, notReady, {Name: "no-agent"}, agentNode("n1", ack(2, ""))},
			metav1.ConditionTrue, metav1.ConditionTrue, ReasonProgrammedOnReadyNodes,
			"programmed on 1/1 nodes with a ready weir-agent; unknown on a-not-ready (weir-agent not ready), a-stale (weir-agent silent for 2m0s), " +
				"no-agent (no weir-agent report): their datapaths keep the policy they last loaded", ""},
		{"no ready agent", []Node{stale, {Name: "no-agent"}},
			metav1.ConditionFalse, metav1.ConditionTrue, ReasonPending, "no node has a ready weir-agent", ""},
		{"a node's warning is in Accepted's message", []Node{agentNode("n1", ack(2, "")),
			agentNode("n2", map[string]PolicyAck{"ClusterNetworkPolicy/p": {Generation: 2, Warning: "egress HTTP rules close connections"}})},
			metav1.ConditionTrue, metav1.ConditionTrue, ReasonProgrammedOnAllNodes, "programmed on 2/2 nodes",
			"no node reports an error compiling this generation; warning: egress HTTP rules close connections"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := ClusterPolicyObject{Kind: policy.KindClusterNetworkPolicy, Name: "p", Generation: 2}
			conds, changed := PolicyConditions(p, tc.nodes, statusNow)
			if !changed {
				t.Error("no change reported from no conditions")
			}
			prog := meta.FindStatusCondition(conds, ConditionProgrammed)
			acc := meta.FindStatusCondition(conds, ConditionAccepted)
			if prog == nil || acc == nil || len(conds) != 2 {
				t.Fatalf("conditions %+v, want Accepted and Programmed", conds)
			}
			if prog.Status != tc.programmed || prog.Reason != tc.reason || prog.Message != tc.message || prog.ObservedGeneration != 2 {
				t.Errorf("Programmed = %s %s %q gen %d, want %s %s %q gen 2", prog.Status, prog.Reason, prog.Message,
					prog.ObservedGeneration, tc.programmed, tc.reason, tc.message)
			}
			wantReason := ReasonValid
			if tc.accepted == metav1.ConditionFalse {
				wantReason = ReasonInvalid
			}
			if acc.Status != tc.accepted || acc.Reason != wantReason || acc.ObservedGeneration != 2 ||
				(tc.acceptedMessage != "" && acc.Message != tc.acceptedMessage) {
				t.Errorf("Accepted = %s %s %q, want %s %s %q", acc.Status, acc.Reason, acc.Message, tc.accepted, wantReason, tc.acceptedMessage)
			}
			if !prog.LastTransitionTime.Time.Equal(statusNow) {
				t.Errorf("new condition's transition time %v, want %v", prog.LastTransitionTime, statusNow)
			}
		})
	}
}

func TestPolicyConditionsChangeOnlyWhenStatusDoes(t *testing.T) {
	earlier := metav1.NewTime(statusNow.Add(-time.Hour))
	programmed := func(status metav1.ConditionStatus, reason, msg string, gen int64) []metav1.Condition {
		return []metav1.Condition{
			{Type: "Vendor", Status: metav1.ConditionTrue, Reason: "Other", LastTransitionTime: earlier},
			{Type: ConditionAccepted, Status: metav1.ConditionTrue, Reason: ReasonValid,
				Message: "no node reports an error compiling this generation", ObservedGeneration: gen, LastTransitionTime: earlier},
			{Type: ConditionProgrammed, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen, LastTransitionTime: earlier},
		}
	}
	for _, tc := range []struct {
		name       string
		have       []metav1.Condition
		nodes      []Node
		changed    bool
		transition metav1.Time // of Programmed
	}{
		{"same", programmed(metav1.ConditionTrue, ReasonProgrammedOnAllNodes, "programmed on 1/1 nodes", 2),
			[]Node{agentNode("n1", ack(2, ""))}, false, earlier},
		{"new generation, still programmed", programmed(metav1.ConditionTrue, ReasonProgrammedOnAllNodes, "programmed on 1/1 nodes", 1),
			[]Node{agentNode("n1", ack(2, ""))}, true, earlier},
		{"one more node", programmed(metav1.ConditionTrue, ReasonProgrammedOnAllNodes, "programmed on 1/1 nodes", 2),
			[]Node{agentNode("n1", ack(2, "")), agentNode("n2", ack(2, ""))}, true, earlier},
		{"now pending", programmed(metav1.ConditionTrue, ReasonProgrammedOnAllNodes, "programmed on 1/1 nodes", 2),
			[]Node{agentNode("n1", ack(2, "")), agentNode("n2", nil)}, true, metav1.NewTime(statusNow)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := ClusterPolicyObject{Kind: policy.KindClusterNetworkPolicy, Name: "p", Generation: 2, Conditions: tc.have}
			before := fmt.Sprint(tc.have)
			conds, changed := PolicyConditions(p, tc.nodes, statusNow)
			if changed != tc.changed {
				t.Errorf("changed = %v, want %v", changed, tc.changed)
			}
			if fmt.Sprint(tc.have) != before {
				t.Error("the current conditions were written to")
			}
			if len(conds) != 3 || conds[0].Type != "Vendor" {
				t.Fatalf("conditions %+v, want the other condition kept first", conds)
			}
			if got := meta.FindStatusCondition(conds, ConditionProgrammed); !got.LastTransitionTime.Equal(&tc.transition) {
				t.Errorf("transition time %v, want %v", got.LastTransitionTime, tc.transition)
			}
			if got := meta.FindStatusCondition(conds, ConditionAccepted); !got.LastTransitionTime.Equal(&earlier) || got.ObservedGeneration != 2 {
				t.Errorf("Accepted %+v, want its old transition time and generation 2", got)
			}
		})
	}
}

func TestPolicyStatusWriterIsFirstReadyNode(t *testing.T) {
	stale := agentNode("a", nil)
	stale.Agent.Updated = statusNow.Add(-time.Hour)
	for _, tc := range []struct {
		name  string
		nodes []Node
		want  string
	}{
		{"first by name", []Node{agentNode("n2", nil), agentNode("n1", nil)}, "n1"},
		{"skips stale and silent agents", []Node{stale, {Name: "b"}, agentNode("n2", nil)}, "n2"},
		{"none ready", []Node{stale}, ""},
	} {
		if got := PolicyStatusWriter(tc.nodes, statusNow); got != tc.want {
			t.Errorf("%s: writer %q, want %q", tc.name, got, tc.want)
		}
	}
}

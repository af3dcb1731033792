package k8s

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/weirnet/weir/internal/policy"
)

// The conditions the agents keep on both cluster policy kinds and on
// WeirNetworkPolicies.
const (
	// ConditionAccepted is whether the policy compiles.
	ConditionAccepted = "Accepted"
	// ConditionProgrammed is whether every node with a ready agent has
	// loaded the policy's current generation into its datapath.
	ConditionProgrammed = "Programmed"

	ReasonValid                = "Valid"
	ReasonInvalid              = "Invalid"
	ReasonPending              = "Pending"
	ReasonProgrammedOnAllNodes = "ProgrammedOnAllNodes"
	// ReasonProgrammedOnReadyNodes: every ready agent programmed it, but
	// some nodes have no ready, current agent; the message names them.
	// Their datapaths keep whatever generation they last loaded.
	ReasonProgrammedOnReadyNodes = "ProgrammedOnReadyNodes"
)

// AgentStale is how old an agent's report may be before its node stops
// counting: an agent refreshes its report every 30 seconds, so one this
// old has stopped, and neither waits for it nor writes for it.
const AgentStale = 2 * time.Minute

// maxLaggingNamed bounds the nodes a Pending message names.
const maxLaggingNamed = 5

// maxConditionMessage is the API server's limit on a condition message.
const maxConditionMessage = 32768

// ClusterPolicyObject is a policy whose status the agents write, as its
// status needs it: what identifies it, and the conditions it has now. It
// is a cluster policy of either kind, or a WeirNetworkPolicy (the one
// namespaced kind with a status).
type ClusterPolicyObject struct {
	Kind            string // policy.KindClusterNetworkPolicy, KindWeirClusterNetworkPolicy or KindWeirNetworkPolicy
	Namespace       string // a WeirNetworkPolicy's; empty for the cluster kinds
	Name            string
	Generation      int64
	ResourceVersion string
	Conditions      []metav1.Condition
	// object is the cached typed object, when it came from a watcher:
	// the base of a status update. Read, never written.
	object runtime.Object
}

// Ref is kind/name (kind/namespace/name for a WeirNetworkPolicy), the
// key of AgentState.ClusterPolicies.
func (p ClusterPolicyObject) Ref() string {
	if p.Namespace != "" {
		return p.Kind + "/" + p.Namespace + "/" + p.Name
	}
	return p.Kind + "/" + p.Name
}

// WeirPolicyRef is a WeirNetworkPolicy's key in AgentState.ClusterPolicies.
func WeirPolicyRef(namespace, name string) string {
	return ClusterPolicyObject{Kind: policy.KindWeirNetworkPolicy, Namespace: namespace, Name: name}.Ref()
}

// AgentReady reports whether n's agent says it programmed the node and
// said so within AgentStale of now.
func AgentReady(n Node, now time.Time) bool {
	return n.Agent != nil && n.Agent.Ready && now.Sub(n.Agent.Updated) < AgentStale
}

// readyAgents is the nodes whose agent is ready, by name.
func readyAgents(nodes []Node, now time.Time) []Node {
	var out []Node
	for _, n := range nodes {
		if AgentReady(n, now) {
			out = append(out, n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// PolicyStatusWriter is the node whose agent writes the cluster policies'
// status: the first by name of those whose agent is ready; empty if none
// is. Every agent elects the same one from the same nodes, and two that
// briefly disagree write the same conditions.
func PolicyStatusWriter(nodes []Node, now time.Time) string {
	if ready := readyAgents(nodes, now); len(ready) > 0 {
		return ready[0].Name
	}
	return ""
}

// PolicyConditions computes p's conditions from what the nodes' agents
// report, and says whether they differ from p's current ones. Conditions
// of other types are kept; a condition whose status does not change keeps
// its LastTransitionTime, one that changes takes now.
//
// Programmed is True when every ready agent reports p's generation
// without an error: ProgrammedOnAllNodes when every node has a ready,
// current agent, else ProgrammedOnReadyNodes naming the nodes that have
// none. It is False, Invalid when one reports an error for it; False,
// Pending otherwise, naming the nodes still behind. Accepted is
// False, Invalid with the error, else True, Valid (its message adds the
// first warning a node reports).
func PolicyConditions(p ClusterPolicyObject, nodes []Node, now time.Time) ([]metav1.Condition, bool) {
	v := tally(p, readyAgents(nodes, now))
	v.silent = silentAgents(nodes, now)
	accepted := metav1.Condition{Type: ConditionAccepted, Status: metav1.ConditionTrue, Reason: ReasonValid,
		Message: "no node reports an error compiling this generation"}
	programmed := metav1.Condition{Type: ConditionProgrammed}
	if v.warn != "" {
		accepted.Message += "; warning: " + v.warn
	}
	switch {
	case v.err != "":
		accepted.Status, accepted.Reason, accepted.Message = metav1.ConditionFalse, ReasonInvalid, v.err
		programmed.Status, programmed.Reason, programmed.Message = metav1.ConditionFalse, ReasonInvalid, v.err
	case v.ready == 0:
		programmed.Status, programmed.Reason = metav1.ConditionFalse, ReasonPending
		programmed.Message = "no node has a ready weir-agent"
	case len(v.lagging) > 0:
		programmed.Status, programmed.Reason = metav1.ConditionFalse, ReasonPending
		programmed.Message = v.pendingMessage()
	case len(v.silent) > 0:
		programmed.Status, programmed.Reason = metav1.ConditionTrue, ReasonProgrammedOnReadyNodes
		programmed.Message = v.silentMessage()
	default:
		programmed.Status, programmed.Reason = metav1.ConditionTrue, ReasonProgrammedOnAllNodes
		programmed.Message = fmt.Sprintf("programmed on %d/%d nodes", v.programmed, v.ready)
	}
	out := make([]metav1.Condition, len(p.Conditions))
	for i := range p.Conditions {
		p.Conditions[i].DeepCopyInto(&out[i])
	}
	for _, c := range []metav1.Condition{accepted, programmed} {
		c.ObservedGeneration = p.Generation
		c.LastTransitionTime = metav1.NewTime(now.UTC().Truncate(time.Second))
		c.Message = clip(c.Message)
		meta.SetStatusCondition(&out, c)
	}
	return out, !equality.Semantic.DeepEqual(p.Conditions, out)
}

// verdicts is what the ready agents say of one policy.
type verdicts struct {
	ready, programmed int
	lagging           []string // "node (generation n)", by node name
	err               string   // the first node's error for this generation
	warn              string   // the first node's warning for it
	silent            []string // "node (why)": nodes with no ready, current agent
}

// silentAgents names the nodes without a ready agent that reported within
// AgentStale, and why, by node name.
func silentAgents(nodes []Node, now time.Time) []string {
	var out []string
	for _, n := range nodes {
		switch {
		case AgentReady(n, now):
			continue
		case n.Agent == nil:
			out = append(out, n.Name+" (no weir-agent report)")
		case !n.Agent.Ready:
			out = append(out, n.Name+" (weir-agent not ready)")
		default:
			out = append(out, fmt.Sprintf("%s (weir-agent silent for %s)", n.Name, now.Sub(n.Agent.Updated).Truncate(time.Second)))
		}
	}
	sort.Strings(out)
	return out
}

func (v verdicts) silentMessage() string {
	return fmt.Sprintf("programmed on %d/%d nodes with a ready weir-agent; unknown on %s: their datapaths keep the policy they last loaded",
		v.programmed, v.ready, nameSome(v.silent))
}

// nameSome lists up to maxLaggingNamed nodes and counts the rest.
func nameSome(nodes []string) string {
	named := nodes[:min(len(nodes), maxLaggingNamed)]
	out := strings.Join(named, ", ")
	if more := len(nodes) - len(named); more > 0 {
		out += fmt.Sprintf(" and %d more", more)
	}
	return out
}

func tally(p ClusterPolicyObject, ready []Node) verdicts {
	v := verdicts{ready: len(ready)}
	ref := p.Ref()
	for _, n := range ready {
		ack, ok := n.Agent.ClusterPolicies[ref]
		switch {
		case !ok:
			v.lagging = append(v.lagging, n.Name+" (none)")
		case ack.Generation != p.Generation:
			v.lagging = append(v.lagging, fmt.Sprintf("%s (generation %d)", n.Name, ack.Generation))
		case ack.Error != "":
			if v.err == "" {
				v.err = ack.Error
			}
		default:
			v.programmed++
			if v.warn == "" {
				v.warn = ack.Warning
			}
		}
	}
	return v
}

func (v verdicts) pendingMessage() string {
	return fmt.Sprintf("programmed on %d/%d nodes; waiting for %s", v.programmed, v.ready, nameSome(v.lagging))
}

// clip keeps a message within the API server's limit.
func clip(s string) string {
	if len(s) <= maxConditionMessage {
		return s
	}
	return strings.ToValidUTF8(s[:maxConditionMessage-3], "") + "..."
}

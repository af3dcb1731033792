package policy

import (
	"fmt"

	"github.com/weirnet/weir/internal/l7"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"
)

// Kinds of policy a rule can come from. The two cluster kinds share one
// precedence order: tier, then priority, then kind (the upstream kind
// first), then name.
const (
	KindNetworkPolicy = "NetworkPolicy"
	// KindClusterNetworkPolicy is policy.networking.k8s.io/v1alpha2.
	KindClusterNetworkPolicy = "ClusterNetworkPolicy"
	// KindWeirClusterNetworkPolicy is weir.io/v1alpha1: the
	// upstream shape with the Reject and Log actions added.
	KindWeirClusterNetworkPolicy = "WeirClusterNetworkPolicy"
)

// Tier is a cluster policy's place around NetworkPolicy.
type Tier uint8

const (
	// TierAdmin is decided before NetworkPolicy.
	TierAdmin Tier = 0
	// TierBaseline is decided after NetworkPolicy, for the traffic no
	// NetworkPolicy selects.
	TierBaseline Tier = 1
)

func (t Tier) String() string {
	if t == TierBaseline {
		return "Baseline"
	}
	return "Admin"
}

// ParseTier reads a spec.tier value.
func ParseTier(s string) (Tier, error) {
	switch s {
	case string(npav1alpha2.AdminTier):
		return TierAdmin, nil
	case string(npav1alpha2.BaselineTier):
		return TierBaseline, nil
	}
	return 0, fmt.Errorf("tier %q: want Admin or Baseline: %w", s, ErrInvalidPolicy)
}

// Action is what a cluster policy rule does with the traffic it matches.
type Action uint8

const (
	ActionNone Action = iota
	// ActionAccept allows, skipping every later tier.
	ActionAccept
	// ActionDeny drops silently: the client times out.
	ActionDeny
	// ActionPass skips the rest of the tier: Admin passes to
	// NetworkPolicy, Baseline to the default (allow).
	ActionPass
	// ActionReject drops and answers, a TCP reset or an ICMP
	// administratively-prohibited, so the client fails at once.
	ActionReject
	// ActionLog records the flow and goes on to the next rule.
	ActionLog
)

var actionNames = [...]string{"", "Accept", "Deny", "Pass", "Reject", "Log"}

func (a Action) String() string {
	if int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// ParseAction reads a rule's action. Reject and Log exist only in Weir's
// own kind; the upstream kind's validation refuses them before here.
func ParseAction(kind, s string) (Action, error) {
	for a := ActionAccept; a <= ActionLog; a++ {
		if actionNames[a] != s {
			continue
		}
		if a >= ActionReject && kind != KindWeirClusterNetworkPolicy {
			return 0, fmt.Errorf("action %q is only in %s: %w", s, KindWeirClusterNetworkPolicy, ErrInvalidPolicy)
		}
		return a, nil
	}
	return 0, fmt.Errorf("action %q: want Accept, Deny, Pass, Reject or Log: %w", s, ErrInvalidPolicy)
}

// ClusterPolicy is a cluster-scoped tiered policy of either cluster kind.
// Its spec has the upstream Go shape; Weir's kind adds only action values,
// which the Action field of the upstream rule types carries as a string.
type ClusterPolicy struct {
	Kind       string
	Name       string
	Generation int64
	Spec       npav1alpha2.ClusterNetworkPolicySpec
	// HTTP holds the HTTP rules of Weir's kind's rules; nil for none.
	HTTP *ClusterHTTP
}

// ClusterHTTP is what WeirClusterNetworkPolicy adds to the upstream
// shape: Ingress[i] are the HTTP rules of spec.ingress[i], Egress
// likewise. A rule with HTTP rules is conditional: on its TCP ports it
// matches only the requests one of them matches, and every other request
// goes on to the rules after it, exactly as traffic a rule does not
// match goes on at L4. Its action (Accept, Deny, Reject, Pass, Log) is
// then the action on those requests; a denied request is answered 403.
type ClusterHTTP struct {
	Ingress, Egress [][]l7.Rule
}

// rules returns the HTTP rules of one rule, nil for none.
func (h *ClusterHTTP) rules(d Direction, index int) []l7.Rule {
	if h == nil {
		return nil
	}
	byRule := h.Ingress
	if d == Egress {
		byRule = h.Egress
	}
	if index >= len(byRule) {
		return nil
	}
	return byRule[index]
}

// AddIngress appends an ingress rule with its HTTP rules (none: an L4
// rule), keeping Spec.Ingress and HTTP.Ingress in step.
func (p *ClusterPolicy) AddIngress(r npav1alpha2.ClusterNetworkPolicyIngressRule, http []l7.Rule) {
	if p.HTTP == nil {
		p.HTTP = &ClusterHTTP{}
	}
	addRule(&p.Spec.Ingress, &p.HTTP.Ingress, r, http)
}

// AddEgress appends an egress rule with its HTTP rules (none: an L4
// rule), keeping Spec.Egress and HTTP.Egress in step.
func (p *ClusterPolicy) AddEgress(r npav1alpha2.ClusterNetworkPolicyEgressRule, http []l7.Rule) {
	if p.HTTP == nil {
		p.HTTP = &ClusterHTTP{}
	}
	addRule(&p.Spec.Egress, &p.HTTP.Egress, r, http)
}

// addRule appends r to rules and its HTTP rules to byRule, which is
// first padded to rules' length (the rules before it had none).
func addRule[R any](rules *[]R, byRule *[][]l7.Rule, r R, http []l7.Rule) {
	for len(*byRule) < len(*rules) {
		*byRule = append(*byRule, nil)
	}
	*rules = append(*rules, r)
	*byRule = append(*byRule, http)
}

// Ref is kind/name, as flows and status name the policy.
func (p *ClusterPolicy) Ref() string { return p.Kind + "/" + p.Name }

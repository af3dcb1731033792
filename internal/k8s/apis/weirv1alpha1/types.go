package weirv1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"
)

// WeirClusterNetworkPolicy is a cluster-wide tiered network policy: an
// upstream ClusterNetworkPolicy whose rules may also Reject or Log.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=wcnp
// +kubebuilder:printcolumn:name="Tier",type=string,JSONPath=".spec.tier"
// +kubebuilder:printcolumn:name="Priority",type=integer,JSONPath=".spec.priority"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
type WeirClusterNetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is what the policy selects and does.
	Spec WeirClusterNetworkPolicySpec `json:"spec"`

	// Status is what the agents report; the same conditions as upstream.
	//
	// +optional
	Status npav1alpha2.ClusterNetworkPolicyStatus `json:"status,omitempty"`
}

// WeirClusterNetworkPolicyList is a list of WeirClusterNetworkPolicy.
//
// +kubebuilder:object:root=true
type WeirClusterNetworkPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WeirClusterNetworkPolicy `json:"items"`
}

// WeirClusterNetworkPolicySpec is ClusterNetworkPolicySpec field for
// field; only the rules differ, in their action.
type WeirClusterNetworkPolicySpec struct {
	// Tier is Admin (decided before NetworkPolicy) or Baseline (decided
	// after it, for traffic no NetworkPolicy selects).
	Tier npav1alpha2.Tier `json:"tier"`

	// Priority orders the policies of one tier, lowest first.
	//
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	Priority int32 `json:"priority"`

	// Subject selects the pods the policy applies to.
	Subject npav1alpha2.ClusterNetworkPolicySubject `json:"subject"`

	// Ingress rules, the first match deciding; none leaves ingress alone.
	//
	// +optional
	// +kubebuilder:validation:MaxItems=25
	Ingress []IngressRule `json:"ingress,omitempty"`

	// Egress rules, the first match deciding; none leaves egress alone.
	//
	// +optional
	// +kubebuilder:validation:MaxItems=25
	Egress []EgressRule `json:"egress,omitempty"`
}

// IngressRule is ClusterNetworkPolicyIngressRule with Weir's actions,
// and HTTP rules.
//
// +kubebuilder:validation:XValidation:rule="!has(self.http) || (has(self.protocols) && self.protocols.all(p, has(p.tcp) && has(p.tcp.destinationPort) && has(p.tcp.destinationPort.number)))",message="http rules need protocols naming single TCP port numbers"
type IngressRule struct {
	// Name identifies the rule in flows and status.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=100
	Name string `json:"name,omitempty"`

	// Action is what the rule does with the traffic it matches.
	Action RuleAction `json:"action"`

	// From are the sources the rule matches; any one is enough.
	//
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=25
	From []npav1alpha2.ClusterNetworkPolicyIngressPeer `json:"from"`

	// Protocols narrow the match to protocols and ports; none matches
	// every protocol.
	//
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=25
	Protocols []npav1alpha2.ClusterNetworkPolicyProtocol `json:"protocols,omitempty"`

	// HTTP rules make the rule conditional: on its TCP ports it matches
	// only the requests one of them matches, in its place in the
	// precedence order, and every other request goes on to the next
	// rule. Accept allows such a request (NetworkPolicy and Baseline are
	// skipped), Deny and Reject answer it 403, Pass sends it on, Log
	// records it. Needs protocols naming single TCP port numbers.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	HTTP []HTTPRule `json:"http,omitempty"`
}

// EgressRule is ClusterNetworkPolicyEgressRule with Weir's actions, and
// HTTP rules.
//
// Only pods have named ports, so a rule with a named port may name only
// pods and namespaces peers (each peer sets exactly one field).
//
// +kubebuilder:validation:XValidation:rule="!has(self.protocols) || !self.protocols.exists(p, has(p.destinationNamedPort)) || self.to.all(peer, has(peer.pods) || has(peer.namespaces))",message="destinationNamedPort needs pods or namespaces peers: networks, nodes and domainNames have no named ports"
// +kubebuilder:validation:XValidation:rule="!has(self.http) || (has(self.protocols) && self.protocols.all(p, has(p.tcp) && has(p.tcp.destinationPort) && has(p.tcp.destinationPort.number)))",message="http rules need protocols naming single TCP port numbers"
type EgressRule struct {
	// Name identifies the rule in flows and status.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=100
	Name string `json:"name,omitempty"`

	// Action is what the rule does with the traffic it matches.
	Action RuleAction `json:"action"`

	// To are the destinations the rule matches; any one is enough.
	//
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=25
	To []npav1alpha2.ClusterNetworkPolicyEgressPeer `json:"to"`

	// Protocols narrow the match to protocols and ports; none matches
	// every protocol.
	//
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=25
	Protocols []npav1alpha2.ClusterNetworkPolicyProtocol `json:"protocols,omitempty"`

	// HTTP rules make the rule conditional: on its TCP ports it matches
	// only the requests one of them matches, in its place in the
	// precedence order, and every other request goes on to the next
	// rule. Accept allows such a request (NetworkPolicy and Baseline are
	// skipped), Deny and Reject answer it 403, Pass sends it on, Log
	// records it. Needs protocols naming single TCP port numbers.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	HTTP []HTTPRule `json:"http,omitempty"`
}

// RuleAction is the upstream rule action plus Reject and Log. The values
// upstream has mean the same here, so converting a rule to the upstream
// types keeps the string.
//
// +kubebuilder:validation:Enum=Accept;Deny;Pass;Reject;Log
type RuleAction string

const (
	// RuleActionAccept allows the traffic; no later tier is consulted.
	RuleActionAccept RuleAction = "Accept"
	// RuleActionDeny drops the traffic silently; the client times out.
	RuleActionDeny RuleAction = "Deny"
	// RuleActionPass skips the rest of the tier.
	RuleActionPass RuleAction = "Pass"
	// RuleActionReject drops the traffic and tells the client (a TCP
	// reset or an ICMP administratively-prohibited), so it fails at once.
	RuleActionReject RuleAction = "Reject"
	// RuleActionLog records the flow and goes on to the next rule.
	RuleActionLog RuleAction = "Log"
)

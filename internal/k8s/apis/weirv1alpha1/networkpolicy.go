package weirv1alpha1

import (
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// WeirNetworkPolicy is a NetworkPolicy whose ports may carry HTTP rules:
// the same selectors, peers and ports, read exactly as NetworkPolicy v1,
// and on a single TCP port a list of HTTP rules, one of which a request
// to that port must match. Rules add up across policies as NetworkPolicy
// rules do: a rule that allows the same peer and port without HTTP rules
// lifts them (docs/l7.md).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=wnp
// +kubebuilder:printcolumn:name="Pods",type=string,JSONPath=".spec.podSelector"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
type WeirNetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is what the policy selects and allows.
	Spec WeirNetworkPolicySpec `json:"spec"`

	// Status is what the agents report.
	//
	// +optional
	Status WeirNetworkPolicyStatus `json:"status,omitempty"`
}

// WeirNetworkPolicyList is a list of WeirNetworkPolicy.
//
// +kubebuilder:object:root=true
type WeirNetworkPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WeirNetworkPolicy `json:"items"`
}

// WeirNetworkPolicySpec is NetworkPolicySpec with WeirNetworkPolicyPort
// for its ports.
type WeirNetworkPolicySpec struct {
	// PodSelector selects the pods of the policy's namespace it applies
	// to; empty selects them all.
	PodSelector metav1.LabelSelector `json:"podSelector"`

	// PolicyTypes are the directions the policy isolates, as
	// NetworkPolicy's.
	//
	// +optional
	// +listType=atomic
	PolicyTypes []networkingv1.PolicyType `json:"policyTypes,omitempty"`

	// Ingress rules: traffic to the selected pods that one allows. At
	// most 16: with at most 64 ports each, 64 HTTP rules a port and 16
	// headers a rule, that bounds what the API server estimates checking
	// every header costs (a CRD over its budget is refused at install).
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Ingress []WeirNetworkPolicyIngressRule `json:"ingress,omitempty"`

	// Egress rules: traffic from the selected pods that one allows; at
	// most 16, as ingress.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Egress []WeirNetworkPolicyEgressRule `json:"egress,omitempty"`
}

// WeirNetworkPolicyIngressRule is NetworkPolicyIngressRule.
type WeirNetworkPolicyIngressRule struct {
	// From are the sources allowed; none allows every source.
	//
	// +optional
	// +listType=atomic
	From []networkingv1.NetworkPolicyPeer `json:"from,omitempty"`

	// Ports are the ports allowed; none allows every port. At most 64.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Ports []WeirNetworkPolicyPort `json:"ports,omitempty"`
}

// WeirNetworkPolicyEgressRule is NetworkPolicyEgressRule.
type WeirNetworkPolicyEgressRule struct {
	// To are the destinations allowed; none allows every destination.
	//
	// +optional
	// +listType=atomic
	To []networkingv1.NetworkPolicyPeer `json:"to,omitempty"`

	// Ports are the ports allowed; none allows every port. At most 64.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Ports []WeirNetworkPolicyPort `json:"ports,omitempty"`
}

// WeirNetworkPolicyPort is NetworkPolicyPort plus HTTP rules.
//
// +kubebuilder:validation:XValidation:rule="!has(self.http) || (has(self.port) && !has(self.endPort) && (!has(self.protocol) || self.protocol == 'TCP'))",message="http rules need one TCP port, by number or name, not a range"
type WeirNetworkPolicyPort struct {
	networkingv1.NetworkPolicyPort `json:",inline"`

	// HTTP rules: when set, a request on this port is allowed only if it
	// matches one of them; a request none matches is answered 403.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	HTTP []HTTPRule `json:"http,omitempty"`
}

// HTTPRule matches a request when every part it sets matches. Its parts
// are Gateway API's HTTPRouteMatch (method, path) and HTTPRoute's
// hostnames, plus a header condition Gateway API lacks (Present).
type HTTPRule struct {
	// Method, when set, is compared exactly.
	//
	// +optional
	Method *gatewayv1.HTTPMethod `json:"method,omitempty"`

	// Path, when set, is compared with the request's path in canonical
	// form: Exact, PathPrefix (by path element) or RegularExpression (RE2,
	// the whole path).
	//
	// +optional
	Path *HTTPPathMatch `json:"path,omitempty"`

	// Hostnames, when set, match a request whose host is one of them:
	// exactly, or for "*.example.com" any name below it.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Hostnames []gatewayv1.Hostname `json:"hostnames,omitempty"`

	// Headers all must match. A header a rule names may appear once in a
	// request; twice is answered 400.
	//
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Headers []HTTPHeaderMatch `json:"headers,omitempty"`
}

// HTTPPathMatch is Gateway API's HTTPPathMatch, the same fields, types
// and defaults, without its CEL rules: under a policy's nested lists
// (rules, ports, HTTP rules) their estimated cost is more than an API
// server admits in a CRD. The agent checks the value instead (a
// canonical absolute path for Exact and PathPrefix, RE2 for
// RegularExpression) and reports a rule it refuses as an event on the
// policy, whose allow then stays closed.
type HTTPPathMatch struct {
	// Type is Exact, PathPrefix (the default) or RegularExpression.
	//
	// +optional
	// +kubebuilder:default=PathPrefix
	Type *gatewayv1.PathMatchType `json:"type,omitempty"`

	// Value is the path, or the expression, to match.
	//
	// +optional
	// +kubebuilder:default="/"
	// +kubebuilder:validation:MaxLength=1024
	Value *string `json:"value,omitempty"`
}

// HTTPHeaderMatchType is how a header's value is compared.
//
// +kubebuilder:validation:Enum=Exact;RegularExpression;Present
type HTTPHeaderMatchType string

// The header match types.
const (
	HTTPHeaderMatchExact             HTTPHeaderMatchType = "Exact"
	HTTPHeaderMatchRegularExpression HTTPHeaderMatchType = "RegularExpression"
	HTTPHeaderMatchPresent           HTTPHeaderMatchType = "Present"
)

// HTTPHeaderMatch is Gateway API's HTTPHeaderMatch plus Present.
//
// +kubebuilder:validation:XValidation:rule="(has(self.type) && self.type == 'Present') == !has(self.value)",message="value is required, except with type Present, which takes none"
type HTTPHeaderMatch struct {
	// Type is Exact (the default), RegularExpression (RE2, the whole
	// value) or Present (any value).
	//
	// +optional
	// +kubebuilder:default=Exact
	Type *HTTPHeaderMatchType `json:"type,omitempty"`

	// Name is the header's name, compared case-insensitively.
	Name gatewayv1.HTTPHeaderName `json:"name"`

	// Value is compared with the header's value.
	//
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Value *string `json:"value,omitempty"`
}

// WeirNetworkPolicyStatus is what the agents report of a policy.
type WeirNetworkPolicyStatus struct {
	// Conditions: Programmed when every node enforces the policy.
	//
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

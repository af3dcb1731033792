package weirv1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// SchemeGroupVersion is weir.io/v1alpha1.
var SchemeGroupVersion = schema.GroupVersion{Group: "weir.io", Version: "v1alpha1"}

// Resource is the WeirClusterNetworkPolicy resource, for dynamic clients.
var Resource = SchemeGroupVersion.WithResource("weirclusternetworkpolicies")

// NetworkPolicyResource is the WeirNetworkPolicy resource.
var NetworkPolicyResource = SchemeGroupVersion.WithResource("weirnetworkpolicies")

var (
	// SchemeBuilder registers this package's kinds.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds this package's kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &WeirClusterNetworkPolicy{}, &WeirClusterNetworkPolicyList{},
		&WeirNetworkPolicy{}, &WeirNetworkPolicyList{})
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}

// Package weirv1alpha1 holds the Go types of Weir's own policy kinds,
// weir.io/v1alpha1:
//
//   - WeirClusterNetworkPolicy: the upstream ClusterNetworkPolicy's spec
//     (policy.networking.k8s.io/v1alpha2), built from the upstream Go
//     types, with two more rule actions, Reject and Log. Keeping the shape
//     lets one compiler path serve both kinds and lets a policy move
//     between them by changing apiVersion and kind.
//   - WeirNetworkPolicy (networkpolicy.go): NetworkPolicy v1's spec, built
//     from its Go types, whose ports may carry HTTP rules in Gateway API's
//     vocabulary (sigs.k8s.io/gateway-api's HTTPMethod, HTTPPathMatch,
//     Hostname).
//
// The deepcopy functions and the CRDs in deploy/ are generated from these
// types by controller-gen; after editing the types run
// `go generate ./internal/k8s/apis/weirv1alpha1 ./deploy`.
//
// Every field is required unless marked optional, as upstream.
//
// +kubebuilder:object:generate=true
// +kubebuilder:validation:Required
// +groupName=weir.io
// +versionName=v1alpha1
package weirv1alpha1

//go:generate go run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0 object paths=.

// Package cnp runs the upstream ClusterNetworkPolicy conformance suite,
// sigs.k8s.io/network-policy-api/conformance, against a running cluster.
//
// It is a module of its own so that the suite's client libraries
// (controller-runtime and the Kubernetes 0.35 staging modules) stay out of
// Weir's dependency graph. The lab builds its test binary once with
// `go test -c` and runs TestConformance with the lab's kubeconfig; see
// `weir lab conformance --suite cnp`.
//
// The only departure from the upstream run is SCTP, which the lab's kernel
// lacks: the base manifests are served without their SCTP servers (agnhost
// porter exits when it cannot listen, so the StatefulSets would never be
// ready), and the lab does not run the tests that probe SCTP.
package cnp

// Package conformance runs the oracles nobody here wrote against a
// Kubernetes lab: cyclonus's generated NetworkPolicy cases, the upstream
// NetworkPolicy suite, sigs.k8s.io/network-policy-api's
// ClusterNetworkPolicy suite, and the upstream sig-network suite that
// judges Services. Each suite is built once from its module (into the
// lab's cache) and run as its authors run it; a run leaves the cluster as
// it found it and writes a JSON result (passed/total, what was not
// runnable and why, the command and commit), the suite's JUnit and log.
package conformance

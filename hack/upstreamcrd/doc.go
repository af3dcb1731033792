// Command upstreamcrd writes the upstream ClusterNetworkPolicy CRD, read
// from the sigs.k8s.io/network-policy-api module this build uses, so the CRD
// Weir installs always matches the Go types it reads the objects with.
//
// It copies the file upstream publishes instead of running controller-gen on
// the upstream types: controller-gen gives the experimental channel's schema
// (with the nodes and domainNames peers) and none of the metadata
// annotations, and the API server refuses a CRD in a *.k8s.io group without
// api-approved.kubernetes.io. Upstream's own generator adds the annotations
// and strips the experimental fields for the standard channel.
//
// Usage, from deploy/generate.go:
//
//	go run ../hack/upstreamcrd -out crd-clusternetworkpolicies.yaml
package main

// Package k8s is the agent's view of the Kubernetes API: informers on
// Nodes and on this node's Pods turned into plain snapshots (no client-go
// types leave the package), and the calls that report the agent's state on
// its Node. It never touches the kernel.
package k8s

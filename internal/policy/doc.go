// Package policy compiles Kubernetes NetworkPolicy into the plain data the
// datapath enforces. It is pure: a Snapshot of namespaces, pods, policies
// and allocated identities goes in, a Result comes out, and Diff tells the
// loader the least it must change. Nothing here touches the kernel or the
// API server, so every rule of the semantics is testable without root.
//
// The model:
//
//   - A security identity is a number for one set of identity labels (a
//     pod's labels, its namespace's name and labels). Pods with the same
//     labels in the same namespace share it. Cluster identities are
//     allocated through the API server (see CandidateIdentity); CIDR
//     identities number the ipBlock prefixes and stay on the node.
//   - The ipcache maps each pod and node address to its identity; the CIDR
//     table maps each ipBlock prefix (cidr and except alike) to a CIDR
//     identity, so the longest matching prefix tells every ipBlock at once
//     whether it contains an address.
//   - Each local endpoint gets per direction an "enforced" flag (some
//     policy selects it for that direction) and a set of allow Keys: peer
//     identity (or any), protocol (or any), and a port prefix, so a port
//     range is a handful of prefixes and a lookup never loops over rules.
//   - A pod's own node (the host identity) can always reach it: enforcing
//     ingress adds an allow for it, as Kubernetes requires. Egress to the
//     node is judged by the egress rules like any other peer.
//
// Evaluate is the same semantics written the obvious way, one packet at a
// time; the tests hold the compiled lookup to it.
package policy

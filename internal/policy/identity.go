package policy

import (
	"hash/fnv"
	"sort"
	"strings"
)

// Identity is a security identity. The datapath stores it in 32 bits.
type Identity uint32

// Reserved identities: the numbers below MinClusterIdentity never name a
// label set.
const (
	// IdentityAny in a policy Key matches every peer, pods and outside
	// addresses alike (a rule with no from/to).
	IdentityAny Identity = 0
	// IdentityHost is this node: its own addresses.
	IdentityHost Identity = 1
	// IdentityWorld is an address the ipcache does not know.
	IdentityWorld Identity = 2
	// IdentityRemoteNode is another node's address.
	IdentityRemoteNode Identity = 3
	// IdentityUnidentified is an address inside a pod CIDR that the
	// ipcache does not know yet (a pod whose address or identity has not
	// reached this node). Never world: the datapath denies it wherever a
	// policy applies. A node names its pods to its peers in the VXLAN
	// network identifier, so in VXLAN mode a peer's new pod has its
	// identity from the first packet.
	IdentityUnidentified Identity = 4

	// MinClusterIdentity and MaxClusterIdentity bound the identities
	// allocated for label sets through the API server. 16 bits leave room
	// to carry an identity in a tunnel header later.
	MinClusterIdentity Identity = 256
	MaxClusterIdentity Identity = 65535

	// MinCIDRIdentity starts the node-local identities of ipBlock prefixes.
	MinCIDRIdentity Identity = 1 << 24
)

// ReservedName names a reserved identity, or "" for any other.
func ReservedName(id Identity) string {
	switch id {
	case IdentityAny:
		return "any"
	case IdentityHost:
		return "host"
	case IdentityWorld:
		return "world"
	case IdentityRemoteNode:
		return "remote-node"
	case IdentityUnidentified:
		return "unidentified"
	}
	return ""
}

// Label prefixes of identity labels, so a pod label and a namespace label
// with the same key stay apart.
const (
	labelPodPrefix       = "k8s:"
	labelNamespacePrefix = "ns:"
	// LabelNamespace carries the pod's namespace name.
	LabelNamespace = "k8s:io.kubernetes.pod.namespace"
)

// Labels is the identity label set of a pod, sorted "key=value" strings.
type Labels []string

// IdentityLabels is the identity label set of a pod with podLabels in ns.
func IdentityLabels(ns Namespace, podLabels map[string]string) Labels {
	out := make(Labels, 0, len(podLabels)+len(ns.Labels)+1)
	out = append(out, LabelNamespace+"="+ns.Name)
	for k, v := range podLabels {
		out = append(out, labelPodPrefix+k+"="+v)
	}
	for k, v := range ns.Labels {
		out = append(out, labelNamespacePrefix+k+"="+v)
	}
	sort.Strings(out)
	return out
}

// Key is the canonical string of the set: one label per line.
func (l Labels) Key() string { return strings.Join(l, "\n") }

// ParseLabelsKey reverses Key.
func ParseLabelsKey(key string) Labels {
	if key == "" {
		return nil
	}
	return strings.Split(key, "\n")
}

// CandidateIdentity is the identity to try for a label set on the given
// attempt (0, 1, ...). Every agent computes the same sequence, so agents
// that race to allocate one label set try the same numbers and meet at one
// identity instead of allocating two; a number taken by another label set
// moves on to the next.
func CandidateIdentity(key string, attempt int) Identity {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	span := uint32(MaxClusterIdentity - MinClusterIdentity + 1)
	return MinClusterIdentity + Identity((h.Sum32()+uint32(attempt))%span)
}

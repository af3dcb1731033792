package policy

import (
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"
)

// Protocol numbers as IP headers carry them.
const (
	ProtoAny  uint8 = 0 // in a Key: every protocol, ICMP included
	ProtoTCP  uint8 = 6
	ProtoUDP  uint8 = 17
	ProtoSCTP uint8 = 132
)

// Namespace is what policy needs of a namespace.
type Namespace struct {
	Name   string
	Labels map[string]string
}

// NamedPort is a container port a pod declares.
type NamedPort struct {
	Name     string
	Port     uint16
	Protocol uint8
}

// Pod is what policy needs of a pod, anywhere in the cluster.
type Pod struct {
	Namespace   string
	Name        string
	Labels      map[string]string
	IPs         []netip.Addr
	Ports       []NamedPort
	HostNetwork bool // not an endpoint: it has its node's addresses
	// Local marks a pod on this node with an endpoint Weir enforces on.
	Local bool
}

// Key is namespace/name.
func (p Pod) Key() string { return p.Namespace + "/" + p.Name }

// Node is what policy needs of a node: the nodes peer of a cluster
// policy selects nodes by label and matches their addresses.
type Node struct {
	Name   string
	Labels map[string]string
	IPs    []netip.Addr
}

// Snapshot is everything the compiler reads, taken at one moment.
type Snapshot struct {
	Namespaces map[string]Namespace
	Pods       []Pod
	Policies   []*networkingv1.NetworkPolicy
	// HTTP marks the Policies that are WeirNetworkPolicies, read as
	// NetworkPolicies for L3 and L4, with their HTTP rules.
	HTTP map[*networkingv1.NetworkPolicy]*PolicyHTTP
	// ClusterPolicies are the cluster-scoped tiered policies of both
	// kinds, in any order.
	ClusterPolicies []*ClusterPolicy
	// Nodes are every node of the cluster, this one too.
	Nodes []Node
	// Identities maps a label set's Key to its allocated cluster identity.
	// A pod whose set has none yet is left out of the ipcache (it is
	// "world" to others until allocated) and reported in Result.Unallocated.
	Identities map[string]Identity
	// HostIPs are this node's addresses; RemoteNodeIPs the other nodes'.
	HostIPs       []netip.Addr
	RemoteNodeIPs []netip.Addr
}

// namespace returns the namespace by name; a missing one has no labels.
func (s *Snapshot) namespace(name string) Namespace {
	if ns, ok := s.Namespaces[name]; ok {
		ns.Name = name
		return ns
	}
	return Namespace{Name: name}
}

package k8s

import (
	"net/netip"
	"sort"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/weirnet/weir/internal/policy"
)

// Node is what the agent needs of a Node: where it is, which pod
// addresses it owns, and its labels, which cluster policies' nodes peers
// select.
type Node struct {
	Name       string
	InternalIP netip.Addr
	PodCIDRs   []netip.Prefix
	Labels     map[string]string
	// Agent is what the node's agent last reported (AgentAnnotation);
	// nil before its first report.
	Agent *AgentState
}

// PodCIDR4 is the node's IPv4 pod CIDR, if it has one.
func (n Node) PodCIDR4() (netip.Prefix, bool) {
	for _, c := range n.PodCIDRs {
		if c.Addr().Is4() {
			return c, true
		}
	}
	return netip.Prefix{}, false
}

// ContainerPort is a port a pod's container declares; named ports are
// what NetworkPolicy resolves against.
type ContainerPort struct {
	Name     string `json:"name,omitempty"`
	Port     int32  `json:"port"`
	Protocol string `json:"protocol"`
}

// Pod is one pod on this node as policy and observability need it.
type Pod struct {
	Namespace   string            `json:"namespace"`
	Name        string            `json:"name"`
	UID         string            `json:"uid"`
	Labels      map[string]string `json:"labels,omitempty"`
	IPs         []netip.Addr      `json:"ips,omitempty"`
	Ports       []ContainerPort   `json:"ports,omitempty"`
	HostNetwork bool              `json:"hostNetwork,omitempty"`
	NodeName    string            `json:"nodeName,omitempty"`
	// Terminal pods (Succeeded, Failed) have given their address back.
	Terminal bool `json:"terminal,omitempty"`
}

// Key is namespace/name.
func (p Pod) Key() string { return p.Namespace + "/" + p.Name }

// Snapshot is the cluster state the agent acts on, taken at one moment.
type Snapshot struct {
	Nodes       []Node // sorted by name
	Pods        []Pod  // this node's pods, sorted by namespace/name
	ClusterPods []Pod  // every scheduled pod, this node's too, sorted
	// Namespaces maps each namespace to its labels.
	Namespaces map[string]map[string]string
	// Policies are the NetworkPolicies and the WeirNetworkPolicies, these
	// read as NetworkPolicies (WeirNetworkPolicyToPolicy), sorted by
	// namespace/name, a NetworkPolicy before a WeirNetworkPolicy of the
	// same name. HTTP holds the HTTP rules of the WeirNetworkPolicies
	// among them, and marks them: a policy without an entry is a
	// NetworkPolicy.
	Policies []*networkingv1.NetworkPolicy
	HTTP     map[*networkingv1.NetworkPolicy]*policy.PolicyHTTP
	// Identities maps label set keys to their cluster identity;
	// IdentityObjects are the objects it was read from.
	Identities      map[string]policy.Identity
	IdentityObjects []IdentityObject
	// ClusterPolicies are the ClusterNetworkPolicies and
	// WeirClusterNetworkPolicies, sorted by kind, then name. Their specs
	// share memory with the watcher's cache: read them, never write.
	ClusterPolicies []*policy.ClusterPolicy
}

// Node finds a node by name.
func (s Snapshot) Node(name string) (Node, bool) {
	i := sort.Search(len(s.Nodes), func(i int) bool { return s.Nodes[i].Name >= name })
	if i < len(s.Nodes) && s.Nodes[i].Name == name {
		return s.Nodes[i], true
	}
	return Node{}, false
}

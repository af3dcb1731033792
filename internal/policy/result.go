package policy

import (
	"fmt"
	"net/netip"
)

// Direction is the side of an endpoint a rule guards.
type Direction uint8

const (
	Ingress Direction = 0
	Egress  Direction = 1
)

func (d Direction) String() string {
	if d == Egress {
		return "egress"
	}
	return "ingress"
}

// Key is one allow entry of an endpoint's policy: traffic in Direction
// with Peer (or any peer), Proto (or any protocol, then every port) and a
// port in Ports. It mirrors the datapath's policy map key without
// importing it, so this package stays free of BPF.
type Key struct {
	Direction Direction
	Peer      Identity
	Proto     uint8
	Ports     PortPrefix
}

func (k Key) String() string {
	peer := ReservedName(k.Peer)
	if peer == "" {
		peer = fmt.Sprint(uint32(k.Peer))
	}
	return fmt.Sprintf("%s peer=%s proto=%s port=%s", k.Direction, peer, ProtoName(k.Proto), k.Ports)
}

// RuleID numbers a rule for the datapath's verdict events. It is stable
// while the rule exists.
type RuleID uint32

// RuleNodeTraffic is the implicit rule that lets a pod's own node reach
// it (and it reach the node), which Kubernetes requires whatever the
// policies say.
const RuleNodeTraffic RuleID = 1

// RuleRef names the rule a RuleID stands for.
type RuleRef struct {
	Namespace string
	Name      string
	Direction Direction
	// Index is the rule's position in spec.ingress or spec.egress.
	Index int
}

func (r RuleRef) String() string {
	if r.Name == "" {
		return "node traffic (always allowed)"
	}
	return fmt.Sprintf("networkpolicy %s/%s %s[%d]", r.Namespace, r.Name, r.Direction, r.Index)
}

// EndpointPolicy is the compiled policy of one local endpoint.
type EndpointPolicy struct {
	Pod      string // namespace/name
	Identity Identity
	// Enforced[d] is set when some policy selects the endpoint for d;
	// otherwise every packet in d is allowed and Allow holds no d keys.
	Enforced [2]bool
	// Allow maps each allow key to the first rule (by policy
	// namespace/name, then rule index) that grants it.
	Allow map[Key]RuleID
	// Policies selecting the endpoint, by direction, as namespace/name.
	Policies [2][]string
}

// Result is the compiled state of a node.
type Result struct {
	Endpoints map[string]*EndpointPolicy // by pod namespace/name, local only
	// IPCache maps pod and node addresses to their identity.
	IPCache map[netip.Addr]Identity
	// CIDRs maps every ipBlock prefix (cidr and except) to its identity.
	CIDRs map[netip.Prefix]Identity
	// Rules names every RuleID an Allow map uses.
	Rules map[RuleID]RuleRef
	// Unallocated lists label set keys seen on pods that have no cluster
	// identity yet, sorted.
	Unallocated []string
	// Errors are policies that could not be compiled. Their subjects stay
	// enforced in the policy's directions with none of its rules: closed.
	Errors []error
}

// PeerIdentities returns the two identities the datapath looks a peer
// address up under: its ipcache identity and the identity of its longest
// matching ipBlock prefix. Either is IdentityWorld when nothing matches.
func (r *Result) PeerIdentities(addr netip.Addr) (label, cidr Identity) {
	label, cidr = IdentityWorld, IdentityWorld
	if id, ok := r.IPCache[addr]; ok {
		label = id
	}
	best := -1
	for p, id := range r.CIDRs {
		if p.Contains(addr) && p.Bits() > best {
			best, cidr = p.Bits(), id
		}
	}
	return label, cidr
}

// Lookup decides a packet the way the datapath does: an unenforced
// direction allows; otherwise the peer's label identity, its CIDR identity
// and the wildcard are tried in turn, each with the longest matching key.
// It returns whether the packet is allowed and the rule that allowed it.
func (r *Result) Lookup(pod string, d Direction, peer netip.Addr, proto uint8, port uint16) (bool, RuleID) {
	ep, ok := r.Endpoints[pod]
	if !ok || !ep.Enforced[d] {
		return true, 0
	}
	label, cidr := r.PeerIdentities(peer)
	for _, id := range []Identity{label, cidr, IdentityAny} {
		if rule, ok := ep.match(d, id, proto, port); ok {
			return true, rule
		}
	}
	return false, 0
}

// match finds the longest key for (d, id, proto, port), as an LPM trie
// whose key ends in protocol then port would.
func (ep *EndpointPolicy) match(d Direction, id Identity, proto uint8, port uint16) (RuleID, bool) {
	for bits := 16; bits >= 0; bits-- {
		p := PortPrefix{Port: port, Bits: uint8(bits)}
		p.Port = maskPort(port, uint8(bits))
		if rule, ok := ep.Allow[Key{d, id, proto, p}]; ok {
			return rule, true
		}
	}
	rule, ok := ep.Allow[Key{d, id, ProtoAny, AllPorts}]
	return rule, ok
}

// maskPort keeps the top bits of port.
func maskPort(port uint16, bits uint8) uint16 {
	if bits == 0 {
		return 0
	}
	return port &^ (1<<(16-bits) - 1)
}

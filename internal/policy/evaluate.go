package policy

import (
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Evaluate decides one packet by reading the policies directly, with no
// identities, prefixes or keys: the NetworkPolicy v1 semantics as the
// Kubernetes documentation states them. target is the pod the direction
// belongs to (the receiver for Ingress, the sender for Egress) and peer
// the address on the other side. It is the reference the compiled Lookup
// is tested against; it is far too slow for the datapath.
func Evaluate(s *Snapshot, target *Pod, d Direction, peer netip.Addr, proto uint8, port uint16) (bool, RuleRef) {
	for _, a := range s.HostIPs {
		if a == peer {
			return true, RuleRef{Direction: d} // the pod's own node
		}
	}
	peerPod := podByIP(s, peer)
	selected := false
	for _, p := range sortedPolicies(s.Policies) {
		if !policySelects(s, p, target, d) {
			continue
		}
		selected = true
		for i, r := range rulesOf(p, d) {
			if peersMatch(s, p.Namespace, r.peers, peer, peerPod) && portsMatch(r.ports, d, target, peerPod, proto, port) {
				return true, RuleRef{Namespace: p.Namespace, Name: p.Name, Direction: d, Index: i}
			}
		}
	}
	return !selected, RuleRef{}
}

// rule is one ingress or egress rule, direction-neutral.
type rule struct {
	peers []networkingv1.NetworkPolicyPeer
	ports []networkingv1.NetworkPolicyPort
}

// rulesOf lists a policy's rules in direction d, in order.
func rulesOf(p *networkingv1.NetworkPolicy, d Direction) []rule {
	var out []rule
	if d == Ingress {
		for _, r := range p.Spec.Ingress {
			out = append(out, rule{r.From, r.Ports})
		}
		return out
	}
	for _, r := range p.Spec.Egress {
		out = append(out, rule{r.To, r.Ports})
	}
	return out
}

func podByIP(s *Snapshot, a netip.Addr) *Pod {
	for i := range s.Pods {
		p := &s.Pods[i]
		if p.HostNetwork {
			continue
		}
		for _, ip := range p.IPs {
			if ip == a {
				return p
			}
		}
	}
	return nil
}

func policySelects(s *Snapshot, p *networkingv1.NetworkPolicy, target *Pod, d Direction) bool {
	if target.HostNetwork || p.Namespace != target.Namespace {
		return false
	}
	ingress, egress, err := policyDirections(p)
	if err != nil {
		ingress, egress = true, true
	}
	if (d == Ingress && !ingress) || (d == Egress && !egress) {
		return false
	}
	sel, err := asSelector(&p.Spec.PodSelector)
	return err == nil && sel.Matches(labels.Set(target.Labels))
}

func peersMatch(s *Snapshot, policyNS string, peers []networkingv1.NetworkPolicyPeer, addr netip.Addr, pod *Pod) bool {
	if len(peers) == 0 {
		return true
	}
	for _, peer := range peers {
		if peerMatches(s, policyNS, peer, addr, pod) {
			return true
		}
	}
	return false
}

func peerMatches(s *Snapshot, policyNS string, peer networkingv1.NetworkPolicyPeer, addr netip.Addr, pod *Pod) bool {
	if peer.IPBlock != nil {
		cidr, err := netip.ParsePrefix(peer.IPBlock.CIDR)
		if err != nil || !cidr.Contains(addr) {
			return false
		}
		for _, e := range peer.IPBlock.Except {
			if ep, err := netip.ParsePrefix(e); err == nil && ep.Contains(addr) {
				return false
			}
		}
		return true
	}
	if pod == nil {
		return false
	}
	if peer.NamespaceSelector == nil {
		if pod.Namespace != policyNS {
			return false
		}
	} else {
		sel, err := asSelector(peer.NamespaceSelector)
		if err != nil || !sel.Matches(labels.Set(s.namespace(pod.Namespace).Labels)) {
			return false
		}
	}
	sel, err := asSelector(peer.PodSelector)
	return err == nil && sel.Matches(labels.Set(pod.Labels))
}

// portsMatch: named ports resolve against the target on ingress and the
// peer pod on egress.
func portsMatch(ports []networkingv1.NetworkPolicyPort, d Direction, target, peerPod *Pod, proto uint8, port uint16) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		want, err := protoNumber(p.Protocol)
		if err != nil || want != proto {
			continue
		}
		if p.Port == nil {
			return true
		}
		if p.Port.StrVal != "" {
			owner := target
			if d == Egress {
				owner = peerPod
			}
			if owner == nil {
				continue
			}
			if n, ok := namedPort(owner.Ports, p.Port.StrVal, proto); ok && n == port {
				return true
			}
			continue
		}
		hi := p.Port.IntVal
		if p.EndPort != nil {
			hi = *p.EndPort
		}
		if int32(port) >= p.Port.IntVal && int32(port) <= hi {
			return true
		}
	}
	return false
}

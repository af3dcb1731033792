package policy

import (
	"errors"
	"net/netip"
	"slices"

	"github.com/weirnet/weir/internal/l7"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Outcome is Evaluate's answer: the verdict, the stage of the
// precedence order that gave it and the rules that did, by name.
type Outcome struct {
	Verdict Verdict
	Stage   Stage
	Rule    RuleRef // zero unless a rule decided
	Log     RuleRef // the first Log rule passed, zero for none
	// Inspect: conditional cluster rules judge the requests (see
	// Decision.Inspect).
	Inspect bool
}

// Evaluate decides one packet by reading the policies directly, with no
// identities, prefixes or keys: the precedence order of the Kubernetes
// network policy APIs written the obvious way (Admin tier, NetworkPolicy,
// Baseline tier, allow). target is the pod the direction belongs to (the
// receiver for Ingress, the sender for Egress) and peer the address on the
// other side. It is the reference the compiled Lookup is tested against;
// it is far too slow for the datapath.
//
// A conditional cluster rule (ClusterHTTP) decides requests, not
// connections: reached before the decision, an Accept or Pass lets the
// connection on (it may let a request on), any other marks it inspected
// and evaluation goes on.
func Evaluate(s *Snapshot, target *Pod, d Direction, peer netip.Addr, proto uint8, port uint16) Outcome {
	return evaluate(s, target, d, peer, proto, port, nil)
}

// evaluate is Evaluate, or with req the decision on one request of the
// connection: a conditional rule then matches when its HTTP rules match
// req as well, and decides as any rule does; NetworkPolicy allows when a
// rule allowing the connection has no HTTP rules on the port or one of
// them matches req.
func evaluate(s *Snapshot, target *Pod, d Direction, peer netip.Addr, proto uint8, port uint16, req *l7.Request) Outcome {
	var out Outcome
	placed, _ := placeClusterPolicies(s.ClusterPolicies)
	tiered, inspect := false, false
	for _, tier := range []Tier{TierAdmin, TierBaseline} {
		if tier == TierBaseline {
			selected, allowed, ref := evaluateNetworkPolicy(s, target, d, peer, proto, port)
			if allowed && selected && req != nil {
				allowed = networkPolicyAllowsRequest(s, target, d, peer, port, req)
			}
			switch {
			case allowed && selected:
				out.Verdict, out.Stage, out.Rule, out.Inspect = VerdictAllow, StageNetworkPolicy, ref, inspect
				return out
			case selected:
				out.Verdict, out.Stage = VerdictDeny, StageNetworkPolicyDefaultDeny
				return out
			}
		}
	tierRules:
		for _, pp := range placed {
			if pp.tier != tier || !clusterSelects(s, pp.p, target) {
				continue
			}
			rules := clusterRules(pp.p, d)
			tiered = tiered || len(rules) > 0
			for i, r := range rules {
				action, ok, conditional := evaluateClusterRule(s, pp.p.Kind, r, target, d, peer, proto, port)
				if !ok {
					continue
				}
				ref := RuleRef{Kind: pp.p.Kind, Name: pp.p.Name, Direction: d, Index: i,
					Tier: tier, Priority: pp.p.Spec.Priority, Action: action, RuleName: r.name}
				if conditional && req != nil && !httpRulesMatch(r.http, req) {
					continue
				}
				if conditional && req == nil {
					if action == ActionAccept || action == ActionPass {
						out.Verdict, out.Stage, out.Rule, out.Inspect = VerdictAllow, stageOf(tier), ref, true
						return out
					}
					inspect = true
					continue
				}
				switch action {
				case ActionLog:
					if out.Log.Name == "" {
						out.Log = ref
					}
				case ActionPass:
					break tierRules
				case ActionAccept:
					out.Verdict, out.Stage, out.Rule, out.Inspect = VerdictAllow, stageOf(tier), ref, inspect
					return out
				case ActionReject:
					out.Verdict, out.Stage, out.Rule = VerdictReject, stageOf(tier), ref
					return out
				default:
					out.Verdict, out.Stage, out.Rule = VerdictDeny, stageOf(tier), ref
					return out
				}
			}
		}
	}
	out.Verdict, out.Stage, out.Inspect = VerdictAllow, StageDefault, inspect
	if !tiered {
		out.Stage = StageUnenforced
	}
	return out
}

// httpRulesMatch reports whether one of rules matches req (rules the
// matcher refuses were refused with their policy before here).
func httpRulesMatch(rules []l7.Rule, req *l7.Request) bool {
	m, err := l7.Compile(rules)
	if err != nil {
		return false
	}
	i, err := m.Match(req)
	return err == nil && i >= 0
}

func stageOf(t Tier) Stage {
	if t == TierBaseline {
		return StageBaseline
	}
	return StageAdmin
}

// evaluateNetworkPolicy is NetworkPolicy v1 alone: whether any policy
// selects target in d, whether one of their rules allows, and which.
func evaluateNetworkPolicy(s *Snapshot, target *Pod, d Direction, peer netip.Addr, proto uint8, port uint16) (selected, allowed bool, ref RuleRef) {
	if d == Ingress && slices.Contains(s.HostIPs, peer) {
		// Ingress from the pod's own node, always allowed; a policy that
		// selects the pod still ends evaluation here. Egress to the node
		// is judged by the rules below like any other peer.
		sel := false
		for _, p := range s.Policies {
			sel = sel || policySelects(s, p, target, d)
		}
		return sel, true, RuleRef{Direction: d}
	}
	peerPod := podByIP(s, peer)
	for _, p := range sortedPolicies(s.Policies) {
		if !policySelects(s, p, target, d) {
			continue
		}
		selected = true
		for i, r := range rulesOf(p, d) {
			if peersMatch(s, p.Namespace, r.peers, peer, peerPod) && portsMatch(r.ports, d, target, peerPod, proto, port) {
				return true, true, RuleRef{Kind: KindNetworkPolicy, Namespace: p.Namespace, Name: p.Name, Direction: d, Index: i}
			}
		}
	}
	return selected, false, RuleRef{}
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
			if n, _, ok := namedPort(owner.Ports, p.Port.StrVal, proto); ok && n == port {
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

// clusterSelects reports whether p's subject selects target.
func clusterSelects(s *Snapshot, p *ClusterPolicy, target *Pod) bool {
	if target.HostNetwork {
		return false
	}
	sub := p.Spec.Subject
	nsLabels := labels.Set(s.namespace(target.Namespace).Labels)
	switch {
	case (sub.Namespaces == nil) == (sub.Pods == nil):
		return false
	case sub.Namespaces != nil:
		return selectorMatches(sub.Namespaces, nsLabels)
	}
	return selectorMatches(&sub.Pods.NamespaceSelector, nsLabels) &&
		selectorMatches(&sub.Pods.PodSelector, labels.Set(target.Labels))
}

func selectorMatches(sel *metav1.LabelSelector, set labels.Set) bool {
	s, err := asSelector(sel)
	return err == nil && s.Matches(set)
}

// evaluateClusterRule reports whether r matches the packet, with what
// action, and whether it is conditional (its HTTP rules decide which
// requests it matches); a rule it cannot read fails closed as the
// compiler's does, unconditionally.
func evaluateClusterRule(s *Snapshot, kind string, r clusterRule, target *Pod, d Direction, peer netip.Addr, proto uint8, port uint16) (action Action, matches, conditional bool) {
	action, err := ParseAction(kind, r.action)
	err = errors.Join(err, checkClusterHTTP(kind, r))
	peerPod := podByIP(s, peer)
	peerOK := false
	for _, p := range r.peers {
		ok, perr := clusterPeerMatches(s, p, peer, peerPod)
		peerOK = peerOK || ok
		err = errors.Join(err, perr)
	}
	if len(r.peers) == 0 || namedPortWithAddressPeer(r) {
		err = errors.Join(err, ErrInvalidPolicy)
	}
	portOK, perr := clusterPortsMatch(r.protocols, d, target, peerPod, proto, port)
	if err = errors.Join(err, perr); err != nil {
		switch action {
		case ActionAccept, ActionLog:
			return action, false, false
		case ActionReject:
			return ActionReject, true, false
		}
		return ActionDeny, true, false
	}
	return action, peerOK && portOK, len(r.http) > 0
}

func clusterPeerMatches(s *Snapshot, p npav1alpha2.ClusterNetworkPolicyEgressPeer, addr netip.Addr, pod *Pod) (bool, error) {
	if countSet(p.Namespaces != nil, p.Pods != nil, p.Nodes != nil, len(p.Networks) > 0, len(p.DomainNames) > 0) != 1 {
		return false, ErrInvalidPolicy
	}
	switch {
	case p.Namespaces != nil:
		return pod != nil && selectorMatches(p.Namespaces, labels.Set(s.namespace(pod.Namespace).Labels)), nil
	case p.Pods != nil:
		return pod != nil && selectorMatches(&p.Pods.NamespaceSelector, labels.Set(s.namespace(pod.Namespace).Labels)) &&
			selectorMatches(&p.Pods.PodSelector, labels.Set(pod.Labels)), nil
	case p.Nodes != nil:
		for _, n := range s.Nodes {
			if selectorMatches(p.Nodes, labels.Set(n.Labels)) && slices.Contains(n.IPs, addr) {
				return true, nil
			}
		}
		return false, nil
	case len(p.Networks) > 0:
		for _, n := range p.Networks {
			cidr, err := netip.ParsePrefix(string(n))
			if err != nil {
				return false, ErrInvalidPolicy
			}
			if cidr.Contains(addr) {
				return true, nil
			}
		}
		return false, nil
	}
	return false, errUnsupportedPeer
}

// clusterPortsMatch: a named port resolves against the target on ingress
// and the peer pod on egress, with the protocol the pod declares.
func clusterPortsMatch(protos []npav1alpha2.ClusterNetworkPolicyProtocol, d Direction, target, peerPod *Pod, proto uint8, port uint16) (bool, error) {
	specs, err := clusterPorts(protos)
	if err != nil {
		return false, err
	}
	for _, spec := range specs {
		if spec.name != "" {
			owner := target
			if d == Egress {
				owner = peerPod
			}
			if owner == nil {
				continue
			}
			if n, p, ok := namedPort(owner.Ports, spec.name, ProtoAny); ok && n == port && p == proto {
				return true, nil
			}
			continue
		}
		if spec.proto != ProtoAny && spec.proto != proto {
			continue
		}
		for _, pp := range spec.ports {
			if pp.Contains(port) {
				return true, nil
			}
		}
	}
	return false, nil
}

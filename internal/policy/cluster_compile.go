package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"

	"github.com/weirnet/weir/internal/l7"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"
)

// Limits of the precedence rank, a uint32 the datapath compares:
// priority (10 bits), the policy's place among policies of its tier and
// priority (16 bits), the rule's index (6 bits).
const (
	MaxClusterPriority     = 1000
	maxPoliciesPerPriority = 1 << 16
	maxRulesPerDirection   = 1 << 6
)

// errUnsupportedPeer is a peer the compiler does not enforce (domainNames
// needs a DNS proxy Weir does not have yet).
var errUnsupportedPeer = errors.New("peer type not supported by weir")

// clusterRule is one ingress or egress rule, direction-neutral: ingress
// peers are the egress peer type with only namespaces and pods set.
type clusterRule struct {
	name      string
	action    string
	peers     []npav1alpha2.ClusterNetworkPolicyEgressPeer
	protocols []npav1alpha2.ClusterNetworkPolicyProtocol
	// http makes the rule conditional (ClusterHTTP); nil for none.
	http []l7.Rule
}

func clusterRules(p *ClusterPolicy, d Direction) []clusterRule {
	var out []clusterRule
	if d == Ingress {
		for i, r := range p.Spec.Ingress {
			peers := make([]npav1alpha2.ClusterNetworkPolicyEgressPeer, len(r.From))
			for i, p := range r.From {
				peers[i] = npav1alpha2.ClusterNetworkPolicyEgressPeer{Namespaces: p.Namespaces, Pods: p.Pods}
			}
			out = append(out, clusterRule{r.Name, string(r.Action), peers, r.Protocols, p.HTTP.rules(d, i)})
		}
		return out
	}
	for i, r := range p.Spec.Egress {
		out = append(out, clusterRule{r.Name, string(r.Action), r.To, r.Protocols, p.HTTP.rules(d, i)})
	}
	return out
}

// checkClusterHTTP refuses HTTP rules the datapath could not hold to: in
// the upstream kind, on a rule whose protocols are not all single TCP
// ports by number (every port, a range, a named port, UDP or SCTP), or
// rules the matcher refuses.
func checkClusterHTTP(kind string, r clusterRule) error {
	if len(r.http) == 0 {
		return nil
	}
	if kind != KindWeirClusterNetworkPolicy {
		return fmt.Errorf("HTTP rules are only in %s: %w", KindWeirClusterNetworkPolicy, ErrInvalidPolicy)
	}
	if len(r.protocols) == 0 {
		return fmt.Errorf("HTTP rules on a rule without protocols: name its TCP ports: %w", ErrInvalidPolicy)
	}
	for i, p := range r.protocols {
		if p.TCP == nil || p.TCP.DestinationPort == nil || p.TCP.DestinationPort.Range != nil || p.TCP.DestinationPort.Number == 0 {
			return fmt.Errorf("protocols[%d]: HTTP rules need every protocol to be one TCP port by number: %w", i, ErrInvalidPolicy)
		}
	}
	if len(r.http) > l7.MaxKernelRules {
		return fmt.Errorf("%d HTTP rules, at most %d: %w", len(r.http), l7.MaxKernelRules, ErrInvalidPolicy)
	}
	if _, err := l7.Compile(r.http); err != nil {
		return fmt.Errorf("%w: %w", err, ErrInvalidPolicy)
	}
	return nil
}

// placedPolicy is a cluster policy with its place in the precedence order.
type placedPolicy struct {
	p    *ClusterPolicy
	tier Tier
	base uint32 // rank of rule 0; rule i ranks base+i
}

// Rank is the precedence rank of rule index of a policy placed ordinal-th
// among the policies of its tier and priority.
func rank(priority int32, ordinal, index int) uint32 {
	return uint32(priority)<<22 | uint32(ordinal)<<6 | uint32(index)
}

func kindOrder(kind string) (int, error) {
	switch kind {
	case KindClusterNetworkPolicy:
		return 0, nil
	case KindWeirClusterNetworkPolicy:
		return 1, nil
	}
	return 0, fmt.Errorf("kind %q: %w", kind, ErrInvalidPolicy)
}

// placeClusterPolicies orders the policies: tier, priority, kind (the
// upstream kind first), name. The API leaves the order of equal
// priorities to the implementation; Weir's is stable and shown by trace.
func placeClusterPolicies(ps []*ClusterPolicy) ([]placedPolicy, []error) {
	type sortable struct {
		placedPolicy
		kind int
	}
	var ok []sortable
	var errs []error
	for _, p := range ps {
		tier, err := ParseTier(string(p.Spec.Tier))
		if err == nil {
			err = checkClusterShape(p)
		}
		kind, kerr := kindOrder(p.Kind)
		if err = errors.Join(err, kerr); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.Ref(), err))
			continue
		}
		ok = append(ok, sortable{placedPolicy{p: p, tier: tier}, kind})
	}
	sort.Slice(ok, func(i, j int) bool {
		a, b := ok[i], ok[j]
		if a.tier != b.tier {
			return a.tier < b.tier
		}
		if a.p.Spec.Priority != b.p.Spec.Priority {
			return a.p.Spec.Priority < b.p.Spec.Priority
		}
		if a.kind != b.kind {
			return a.kind < b.kind
		}
		return a.p.Name < b.p.Name
	})
	out := make([]placedPolicy, 0, len(ok))
	ordinal := 0
	for i, s := range ok {
		if i > 0 && (s.tier != ok[i-1].tier || s.p.Spec.Priority != ok[i-1].p.Spec.Priority) {
			ordinal = 0
		}
		if ordinal >= maxPoliciesPerPriority {
			errs = append(errs, fmt.Errorf("%s: more than %d policies share tier %s priority %d: %w",
				s.p.Ref(), maxPoliciesPerPriority, s.tier, s.p.Spec.Priority, ErrInvalidPolicy))
			continue
		}
		s.base = rank(s.p.Spec.Priority, ordinal, 0)
		out = append(out, s.placedPolicy)
		ordinal++
	}
	return out, errs
}

// checkClusterShape refuses what would not fit the rank.
func checkClusterShape(p *ClusterPolicy) error {
	if p.Spec.Priority < 0 || p.Spec.Priority > MaxClusterPriority {
		return fmt.Errorf("priority %d: want 0 to %d: %w", p.Spec.Priority, MaxClusterPriority, ErrInvalidPolicy)
	}
	if len(p.Spec.Ingress) > maxRulesPerDirection || len(p.Spec.Egress) > maxRulesPerDirection {
		return fmt.Errorf("more than %d rules in one direction: %w", maxRulesPerDirection, ErrInvalidPolicy)
	}
	return nil
}

// applyClusterPolicies compiles every cluster policy into the entries of
// the endpoints it selects.
func (cp *compilation) applyClusterPolicies() {
	placed, errs := placeClusterPolicies(cp.s.ClusterPolicies)
	cp.res.Errors = append(cp.res.Errors, errs...)
	for _, pp := range placed {
		if err := cp.applyClusterPolicy(pp); err != nil {
			cp.res.Errors = append(cp.res.Errors, fmt.Errorf("%s: %w", pp.p.Ref(), err))
		}
	}
}

func (cp *compilation) applyClusterPolicy(pp placedPolicy) error {
	subjects, err := cp.clusterSubjects(pp.p.Spec.Subject)
	if err != nil {
		return err // selects nothing it can name
	}
	var errs []error
	for _, d := range []Direction{Ingress, Egress} {
		rules := clusterRules(pp.p, d)
		if len(rules) == 0 {
			continue
		}
		for _, pod := range subjects {
			ep := cp.res.Endpoints[pod.Key()]
			ep.Tiered[d] = true
			ep.Policies[d] = append(ep.Policies[d], pp.p.Ref())
		}
		for i, r := range rules {
			if err := cp.applyClusterRule(pp, d, i, r, subjects); err != nil {
				errs = append(errs, fmt.Errorf("%s[%d]: %w", d, i, err))
			}
		}
	}
	return errors.Join(errs...)
}

// applyClusterRule adds one rule to its subjects' entries. A rule the
// compiler cannot read fails closed as the API asks: an Accept or Log rule
// matches nothing, a Deny, Reject or Pass rule denies (or rejects) all.
func (cp *compilation) applyClusterRule(pp placedPolicy, d Direction, index int, r clusterRule, subjects []*Pod) error {
	action, actErr := ParseAction(pp.p.Kind, r.action)
	targets, peerErr := cp.clusterPeerTargets(r.peers)
	specs, portErr := clusterPorts(r.protocols)
	err := errors.Join(actErr, peerErr, portErr, checkClusterHTTP(pp.p.Kind, r))
	if namedPortWithAddressPeer(r) {
		err = errors.Join(err, fmt.Errorf("named port with a networks, nodes or domainNames peer: %w", ErrInvalidPolicy))
	}
	if err != nil {
		switch action {
		case ActionAccept, ActionLog:
			return err
		case ActionReject:
		default:
			action = ActionDeny
		}
		targets = []peerTarget{{id: IdentityAny}}
		specs = []portSpec{{proto: ProtoAny, ports: []PortPrefix{AllPorts}}}
		r.http = nil
	}
	if len(subjects) == 0 {
		return err
	}
	ref := RuleRef{Kind: pp.p.Kind, Name: pp.p.Name, Direction: d, Index: index,
		Tier: pp.tier, Priority: pp.p.Spec.Priority, Action: action, RuleName: r.name}
	m := Match{Rule: RuleID(cp.c.rules.get(ref)), Rank: pp.base + uint32(index), Action: action}
	set := cp.http.tierSet(m, pp.tier, r.http)
	used := false
	for _, subj := range subjects {
		ep := cp.res.Endpoints[subj.Key()]
		for _, k := range ruleKeys(d, targets, specs, subj, cp.sets, cp.cidrIDs) {
			used = true
			e := ep.Entries[k]
			switch {
			case set != 0:
				e.Tiers = cp.http.unionTiers(e.Tiers, set)
			case action == ActionLog:
				if m.before(e.Log[pp.tier]) {
					e.Log[pp.tier] = m
				}
			case m.before(e.Tier[pp.tier]):
				e.Tier[pp.tier] = m
			}
			ep.Entries[k] = e
		}
	}
	if used {
		cp.res.Rules[m.Rule] = ref
		cp.usedRule[ref] = true
	}
	return err
}

// clusterSubjects are the local endpoints a subject selects; exactly one
// of its fields is set.
func (cp *compilation) clusterSubjects(s npav1alpha2.ClusterNetworkPolicySubject) ([]*Pod, error) {
	var sets []*labelSet
	var err error
	switch {
	case (s.Namespaces == nil) == (s.Pods == nil):
		return nil, fmt.Errorf("subject: set exactly one of namespaces and pods: %w", ErrInvalidPolicy)
	case s.Namespaces != nil:
		sets, err = cp.selector.selectPeers("", s.Namespaces, nil)
	default:
		sets, err = cp.selector.selectPeers("", &s.Pods.NamespaceSelector, &s.Pods.PodSelector)
	}
	if err != nil {
		return nil, fmt.Errorf("subject: %w", err)
	}
	var out []*Pod
	for _, set := range sets {
		for _, pod := range set.pods {
			if pod.Local {
				out = append(out, pod)
			}
		}
	}
	return out, nil
}

// clusterPeerTargets resolves a rule's peers (the API requires at least
// one). It returns what it could resolve and an error for the rest.
func (cp *compilation) clusterPeerTargets(peers []npav1alpha2.ClusterNetworkPolicyEgressPeer) ([]peerTarget, error) {
	if len(peers) == 0 {
		return nil, fmt.Errorf("no peers: %w", ErrInvalidPolicy)
	}
	var out []peerTarget
	var errs []error
	for i, peer := range peers {
		targets, err := cp.clusterPeer(peer)
		if err != nil {
			errs = append(errs, fmt.Errorf("peer %d: %w", i, err))
			continue
		}
		out = append(out, targets...)
	}
	return out, errors.Join(errs...)
}

func (cp *compilation) clusterPeer(peer npav1alpha2.ClusterNetworkPolicyEgressPeer) ([]peerTarget, error) {
	if n := countSet(peer.Namespaces != nil, peer.Pods != nil, peer.Nodes != nil,
		len(peer.Networks) > 0, len(peer.DomainNames) > 0); n != 1 {
		return nil, fmt.Errorf("%d peer fields set, want exactly one: %w", n, ErrInvalidPolicy)
	}
	switch {
	case peer.Namespaces != nil:
		sets, err := cp.selector.selectPeers("", peer.Namespaces, nil)
		return setTargets(sets), err
	case peer.Pods != nil:
		sets, err := cp.selector.selectPeers("", &peer.Pods.NamespaceSelector, &peer.Pods.PodSelector)
		return setTargets(sets), err
	case peer.Nodes != nil:
		return cp.nodeTargets(peer.Nodes)
	case len(peer.Networks) > 0:
		return cp.networkTargets(peer.Networks)
	}
	return nil, fmt.Errorf("domainNames: %w", errUnsupportedPeer)
}

func countSet(set ...bool) int {
	n := 0
	for _, s := range set {
		if s {
			n++
		}
	}
	return n
}

func setTargets(sets []*labelSet) []peerTarget {
	var out []peerTarget
	for _, s := range sets {
		if s.id != 0 {
			out = append(out, peerTarget{id: s.id, set: s})
		}
	}
	return out
}

// networkTargets are the CIDR identities inside the networks: pod and
// node addresses in them are matched too, as the API says.
func (cp *compilation) networkTargets(networks []npav1alpha2.CIDR) ([]peerTarget, error) {
	var out []peerTarget
	for _, n := range networks {
		p, err := netip.ParsePrefix(string(n))
		if err != nil {
			return nil, fmt.Errorf("network %q: %w", n, ErrInvalidPolicy)
		}
		for _, np := range within(cp.cidrs, p.Masked()) {
			t := peerTarget{id: np.id}
			if np.p.IsSingleIP() {
				t.pod = cp.podByIP[np.p.Addr()]
			}
			out = append(out, t)
		}
	}
	return out, nil
}

// nodeTargets are the single-address CIDR identities of the selected
// nodes' addresses (buildCIDRs numbers them).
func (cp *compilation) nodeTargets(sel *metav1.LabelSelector) ([]peerTarget, error) {
	s, err := asSelector(sel)
	if err != nil {
		return nil, fmt.Errorf("nodes: %w", err)
	}
	var out []peerTarget
	for _, n := range cp.s.Nodes {
		if !s.Matches(labels.Set(n.Labels)) {
			continue
		}
		for _, a := range n.IPs {
			if id, ok := cp.cidrIDs[netip.PrefixFrom(a, a.BitLen())]; ok {
				out = append(out, peerTarget{id: id})
			}
		}
	}
	return out, nil
}

// clusterPorts parses a rule's protocols; none means every protocol and
// port. A named port matches whatever protocol the pod declares it with.
func clusterPorts(protos []npav1alpha2.ClusterNetworkPolicyProtocol) ([]portSpec, error) {
	if len(protos) == 0 {
		return []portSpec{{proto: ProtoAny, ports: []PortPrefix{AllPorts}}}, nil
	}
	out := make([]portSpec, 0, len(protos))
	for i, p := range protos {
		if n := countSet(p.TCP != nil, p.UDP != nil, p.SCTP != nil, p.DestinationNamedPort != ""); n != 1 {
			return nil, fmt.Errorf("protocols[%d]: %d fields set, want exactly one: %w", i, n, ErrInvalidPolicy)
		}
		var spec portSpec
		var port *npav1alpha2.Port
		switch {
		case p.TCP != nil:
			spec.proto, port = ProtoTCP, p.TCP.DestinationPort
		case p.UDP != nil:
			spec.proto, port = ProtoUDP, p.UDP.DestinationPort
		case p.SCTP != nil:
			spec.proto, port = ProtoSCTP, p.SCTP.DestinationPort
		default:
			out = append(out, portSpec{proto: ProtoAny, name: p.DestinationNamedPort})
			continue
		}
		ports, err := clusterPortPrefixes(port)
		if err != nil {
			return nil, fmt.Errorf("protocols[%d]: %w", i, err)
		}
		spec.ports = ports
		out = append(out, spec)
	}
	return out, nil
}

func clusterPortPrefixes(p *npav1alpha2.Port) ([]PortPrefix, error) {
	switch {
	case p == nil:
		return []PortPrefix{AllPorts}, nil
	case p.Range != nil:
		if p.Range.Start < 1 || p.Range.End > 65535 || p.Range.End < p.Range.Start {
			return nil, fmt.Errorf("port range %d-%d: %w", p.Range.Start, p.Range.End, ErrInvalidPolicy)
		}
		return RangePrefixes(uint16(p.Range.Start), uint16(p.Range.End)), nil
	case p.Number >= 1 && p.Number <= 65535:
		return []PortPrefix{{Port: uint16(p.Number), Bits: 16}}, nil
	}
	return nil, fmt.Errorf("port %d: want 1 to 65535: %w", p.Number, ErrInvalidPolicy)
}

// clusterPrefixes calls add for every prefix the cluster policies name:
// networks, and the addresses of nodes when some rule selects nodes.
func (cp *compilation) clusterPrefixes(add func(string)) {
	nodes := false
	for _, p := range cp.s.ClusterPolicies {
		for _, r := range p.Spec.Egress {
			for _, peer := range r.To {
				for _, n := range peer.Networks {
					add(string(n))
				}
				nodes = nodes || peer.Nodes != nil
			}
		}
	}
	if !nodes {
		return
	}
	for _, n := range cp.s.Nodes {
		for _, a := range n.IPs {
			add(netip.PrefixFrom(a, a.BitLen()).String())
		}
	}
}

// clusterEgressNamedPorts are the named ports cluster egress rules use.
func clusterEgressNamedPorts(ps []*ClusterPolicy, names map[string]bool) {
	for _, p := range ps {
		for _, r := range p.Spec.Egress {
			for _, proto := range r.Protocols {
				if proto.DestinationNamedPort != "" {
					names[proto.DestinationNamedPort] = true
				}
			}
		}
	}
}

// namedPortWithAddressPeer reports a rule the API refuses: a named port
// with a networks or nodes peer, which have no named ports.
func namedPortWithAddressPeer(r clusterRule) bool {
	named := false
	for _, p := range r.protocols {
		named = named || p.DestinationNamedPort != ""
	}
	if !named {
		return false
	}
	for _, p := range r.peers {
		if p.Nodes != nil || len(p.Networks) > 0 || len(p.DomainNames) > 0 {
			return true
		}
	}
	return false
}

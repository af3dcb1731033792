package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Compiler turns snapshots into Results. It keeps only the numbering of
// CIDR identities, rules and HTTP sets between runs, so an unchanged
// prefix, rule or set keeps its number and Diff stays small.
type Compiler struct {
	cidrs idAllocator[netip.Prefix]
	rules idAllocator[RuleRef]
	http  idAllocator[string] // HTTP sets by content: HTTPSetID
	// MaxCIDRs bounds the CIDR identities of one Result (the datapath's
	// CIDR map holds that many; 0: no bound). Cluster policies and pod
	// prefixes are numbered first; NetworkPolicies are admitted smallest
	// first, each whole or refused with ErrPolicyTooLarge.
	MaxCIDRs int
	// MaxKeys bounds the policy keys of one Result (0: no bound). Over
	// it, the NetworkPolicies of the namespaces whose endpoints hold the
	// most keys are refused with ErrPolicyTooLarge, smallest namespaces
	// admitted first, so one namespace cannot fill the node's policy map
	// and make another tenant's endpoints fail.
	MaxKeys int
}

// NewCompiler returns a compiler with fresh numbering.
func NewCompiler() *Compiler {
	return &Compiler{
		cidrs: newIDAllocator[netip.Prefix](uint32(MinCIDRIdentity)),
		rules: newIDAllocator[RuleRef](uint32(RuleNodeTraffic) + 1),
		http:  newIDAllocator[string](1),
	}
}

// compilation is the working state of one Compile.
type compilation struct {
	s        *Snapshot
	c        *Compiler
	res      *Result
	sets     []*labelSet
	selector *selectorCache
	cidrIDs  map[netip.Prefix]Identity
	cidrs    []numberedPrefix                      // cidrIDs by address, for ipBlock range queries
	refused  map[*networkingv1.NetworkPolicy]error // over the CIDR budget
	// refusedNS are the namespaces whose NetworkPolicies are over the
	// key budget.
	refusedNS map[string]error
	podByIP   map[netip.Addr]*Pod
	usedCIDR  map[netip.Prefix]bool
	usedRule  map[RuleRef]bool
	http      *httpSets
}

// Compile compiles s. It never fails as a whole: a policy it cannot read
// is reported in Result.Errors and closes its subjects instead.
func (c *Compiler) Compile(s *Snapshot) *Result {
	res := c.compile(s, nil)
	if c.MaxKeys <= 0 || res.keyCount() <= c.MaxKeys {
		return res
	}
	// Over the key budget: compile again without the NetworkPolicies of
	// the namespaces that do not fit. Closed subjects hold fewer keys, so
	// this converges; each round refuses at least one more namespace.
	refused := map[string]error{}
	for {
		more := overKeyBudget(res, c.MaxKeys, refused, namespacesWithPolicies(s))
		if len(more) == 0 {
			return res
		}
		for ns, err := range more {
			refused[ns] = err
		}
		res = c.compile(s, refused)
		if res.keyCount() <= c.MaxKeys {
			return res
		}
	}
}

func (c *Compiler) compile(s *Snapshot, refusedNS map[string]error) *Result {
	cp := &compilation{
		s: s, c: c,
		res: &Result{
			Endpoints: map[string]*EndpointPolicy{},
			IPCache:   map[netip.Addr]Identity{},
			CIDRs:     map[netip.Prefix]Identity{},
			Rules:     map[RuleID]RuleRef{},
			matchers:  &httpMatchers{},
		},
		refusedNS: refusedNS,
		usedCIDR:  map[netip.Prefix]bool{},
		usedRule:  map[RuleRef]bool{},
	}
	cp.http = newHTTPSets(cp.res, &c.http)
	cp.buildLabelSets()
	cp.buildIPCache()
	cp.buildCIDRs()
	cp.buildEndpoints()
	for _, p := range sortedPolicies(s.Policies) {
		err := cp.refusedNS[p.Namespace]
		if err == nil {
			err = cp.refused[p]
		}
		if err != nil {
			cp.closeSubjects(p)
			cp.res.Errors = append(cp.res.Errors, &NetworkPolicyError{Namespace: p.Namespace, Name: p.Name, Err: err, Kind: s.policyKind(p)})
			continue
		}
		if err := cp.applyPolicy(p); err != nil {
			cp.res.Errors = append(cp.res.Errors, &NetworkPolicyError{Namespace: p.Namespace, Name: p.Name, Err: err, Kind: s.policyKind(p)})
		}
	}
	cp.applyClusterPolicies()
	for _, ep := range cp.res.Endpoints {
		ep.Entries = flatten(ep.Entries, cp.http)
		for k, e := range ep.Entries {
			ep.Entries[k] = cp.http.finishTiers(e, ep.Enforced[k.Direction])
		}
	}
	cp.http.keepReferenced(cp.res.Endpoints)
	c.cidrs.keepOnly(cp.usedCIDR)
	c.rules.forget(cp.usedRule) // a rule's number is never reused: verdict counters are keyed by it
	c.http.forget(cp.http.used) // nor a set's: the datapath holds sets by number
	return cp.res
}

func sortedPolicies(ps []*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
	out := append([]*networkingv1.NetworkPolicy(nil), ps...)
	// Stable: a NetworkPolicy and a WeirNetworkPolicy may share a name,
	// and keep the order the snapshot lists them in.
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// buildLabelSets groups pod-network pods by identity label set.
func (cp *compilation) buildLabelSets() {
	byKey := map[string]*labelSet{}
	for i := range cp.s.Pods {
		p := &cp.s.Pods[i]
		if p.HostNetwork {
			continue
		}
		ns := cp.s.namespace(p.Namespace)
		key := IdentityLabels(ns, p.Labels).Key()
		set, ok := byKey[key]
		if !ok {
			set = &labelSet{key: key, namespace: ns.Name,
				podLabels: labels.Set(p.Labels), nsLabels: labels.Set(ns.Labels)}
			set.id = cp.s.Identities[key]
			byKey[key] = set
			cp.sets = append(cp.sets, set)
			if set.id == 0 {
				cp.res.Unallocated = append(cp.res.Unallocated, key)
			}
		}
		set.pods = append(set.pods, p)
	}
	sort.Slice(cp.sets, func(i, j int) bool { return cp.sets[i].key < cp.sets[j].key })
	sort.Strings(cp.res.Unallocated)
	cp.selector = newSelectorCache(cp.sets)
	cp.podByIP = map[netip.Addr]*Pod{}
	for _, set := range cp.sets {
		for _, p := range set.pods {
			for _, a := range p.IPs {
				cp.podByIP[a] = p
			}
		}
	}
}

func (cp *compilation) buildIPCache() {
	for _, a := range cp.s.RemoteNodeIPs {
		cp.res.IPCache[a] = IdentityRemoteNode
	}
	for _, a := range cp.s.HostIPs {
		cp.res.IPCache[a] = IdentityHost
	}
	for _, set := range cp.sets {
		if set.id == 0 {
			continue
		}
		for _, p := range set.pods {
			for _, a := range p.IPs {
				cp.res.IPCache[a] = set.id
			}
		}
	}
}

// buildCIDRs numbers every prefix any ipBlock names, so the longest match
// of an address decides every ipBlock at once. Within MaxCIDRs: cluster
// policies' and pods' prefixes first, then NetworkPolicies smallest first,
// each admitted whole or refused.
func (cp *compilation) buildCIDRs() {
	cp.cidrIDs = map[netip.Prefix]Identity{}
	cp.refused = map[*networkingv1.NetworkPolicy]error{}
	add := func(s string) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return // reported when the policy is applied
		}
		cp.number(p.Masked())
	}
	cp.clusterPrefixes(add)
	cp.addPodPrefixes(add)
	for _, w := range policyPrefixesBySize(cp.s.Policies) {
		if cp.refusedNS[w.policy.Namespace] != nil {
			continue // refused whole, prefixes and all
		}
		fresh := 0
		for _, p := range w.prefixes {
			if _, ok := cp.cidrIDs[p]; !ok {
				fresh++
			}
		}
		if max := cp.c.MaxCIDRs; max > 0 && len(cp.cidrIDs)+fresh > max {
			cp.refused[w.policy] = fmt.Errorf("its ipBlocks need %d more CIDR entries, %d of %d are left: %w",
				fresh, max-len(cp.cidrIDs), max, ErrPolicyTooLarge)
			continue
		}
		for _, p := range w.prefixes {
			cp.number(p)
		}
	}
	cp.cidrs = sortedPrefixes(cp.cidrIDs)
}

// number gives p a CIDR identity, keeping the one it had.
func (cp *compilation) number(p netip.Prefix) {
	if _, ok := cp.cidrIDs[p]; ok {
		return
	}
	id := Identity(cp.c.cidrs.get(p))
	cp.cidrIDs[p], cp.res.CIDRs[p] = id, id
	cp.usedCIDR[p] = true
}

// policyPrefixes is a NetworkPolicy with the distinct prefixes its
// ipBlocks name.
type policyPrefixes struct {
	policy   *networkingv1.NetworkPolicy
	prefixes []netip.Prefix
}

// policyPrefixesBySize lists the policies that name prefixes, fewest
// first, then by namespace and name: a policy that would take the map
// from everyone else is the one refused, whatever its name.
func policyPrefixesBySize(ps []*networkingv1.NetworkPolicy) []policyPrefixes {
	var out []policyPrefixes
	for _, pol := range sortedPolicies(ps) {
		seen := map[netip.Prefix]bool{}
		var prefixes []netip.Prefix
		note := func(s string) {
			if p, err := netip.ParsePrefix(s); err == nil && !seen[p.Masked()] {
				seen[p.Masked()] = true
				prefixes = append(prefixes, p.Masked())
			}
		}
		forEachPeer(pol, func(_ Direction, _ int, peer networkingv1.NetworkPolicyPeer) {
			if peer.IPBlock == nil {
				return
			}
			note(peer.IPBlock.CIDR)
			for _, e := range peer.IPBlock.Except {
				note(e)
			}
		})
		if len(prefixes) > 0 {
			out = append(out, policyPrefixes{pol, prefixes})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i].prefixes) < len(out[j].prefixes) })
	return out
}

// numberedPrefix is a prefix with its CIDR identity.
type numberedPrefix struct {
	p  netip.Prefix
	id Identity
}

// sortedPrefixes orders prefixes by address, then length: the prefixes
// that begin inside a block are then one contiguous run.
func sortedPrefixes(ids map[netip.Prefix]Identity) []numberedPrefix {
	out := make([]numberedPrefix, 0, len(ids))
	for p, id := range ids {
		out = append(out, numberedPrefix{p, id})
	}
	sort.Slice(out, func(i, j int) bool {
		if c := out[i].p.Addr().Compare(out[j].p.Addr()); c != 0 {
			return c < 0
		}
		return out[i].p.Bits() < out[j].p.Bits()
	})
	return out
}

// within returns the numbered prefixes block covers. They begin at an
// address inside block and are no shorter than it, so a binary search
// finds the first and the run ends at the first address past the block:
// a rule's cost does not grow with the number of other ipBlocks.
func within(sorted []numberedPrefix, block netip.Prefix) []numberedPrefix {
	start := block.Masked().Addr()
	i := sort.Search(len(sorted), func(i int) bool { return sorted[i].p.Addr().Compare(start) >= 0 })
	var out []numberedPrefix
	for ; i < len(sorted) && block.Contains(sorted[i].p.Addr()); i++ {
		if sorted[i].p.Bits() >= block.Bits() {
			out = append(out, sorted[i])
		}
	}
	return out
}

// addPodPrefixes gives the address of each pod that declares a port some
// egress rule names its own prefix. An egress named port resolves against
// the destination pod, and pods with one identity may number a name
// differently, so such keys name the pod's address, not its identity.
func (cp *compilation) addPodPrefixes(add func(string)) {
	names := map[string]bool{}
	for _, pol := range cp.s.Policies {
		for _, r := range pol.Spec.Egress {
			for _, p := range r.Ports {
				if p.Port != nil && p.Port.Type == intstr.String {
					names[p.Port.StrVal] = true
				}
			}
		}
	}
	clusterEgressNamedPorts(cp.s.ClusterPolicies, names)
	if len(names) == 0 {
		return
	}
	for a, pod := range cp.podByIP {
		for _, port := range pod.Ports {
			if names[port.Name] {
				add(netip.PrefixFrom(a, a.BitLen()).String())
				break
			}
		}
	}
}

func forEachPeer(p *networkingv1.NetworkPolicy, f func(Direction, int, networkingv1.NetworkPolicyPeer)) {
	for i, r := range p.Spec.Ingress {
		for _, peer := range r.From {
			f(Ingress, i, peer)
		}
	}
	for i, r := range p.Spec.Egress {
		for _, peer := range r.To {
			f(Egress, i, peer)
		}
	}
}

func (cp *compilation) buildEndpoints() {
	for _, set := range cp.sets {
		for _, p := range set.pods {
			if !p.Local {
				continue
			}
			cp.res.Endpoints[p.Key()] = &EndpointPolicy{Pod: p.Key(), Identity: set.id, Entries: map[Key]Entry{}}
		}
	}
}

// policyDirections returns which directions p governs: policyTypes when
// given, else ingress always and egress when it has egress rules.
func policyDirections(p *networkingv1.NetworkPolicy) (ingress, egress bool, err error) {
	if len(p.Spec.PolicyTypes) == 0 {
		return true, len(p.Spec.Egress) > 0, nil
	}
	for _, t := range p.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		default:
			return false, false, fmt.Errorf("policyType %q: %w", t, ErrInvalidPolicy)
		}
	}
	return ingress, egress, nil
}

// subjects are the local endpoints p selects.
func (cp *compilation) subjects(p *networkingv1.NetworkPolicy) ([]*Pod, error) {
	sel, err := asSelector(&p.Spec.PodSelector)
	if err != nil {
		return nil, fmt.Errorf("podSelector: %w", err)
	}
	var out []*Pod
	for _, set := range cp.sets {
		if set.namespace != p.Namespace || !sel.Matches(set.podLabels) {
			continue
		}
		for _, pod := range set.pods {
			if pod.Local {
				out = append(out, pod)
			}
		}
	}
	return out, nil
}

func (cp *compilation) applyPolicy(p *networkingv1.NetworkPolicy) error {
	ingress, egress, dirErr := policyDirections(p)
	subjects, err := cp.subjects(p)
	if err != nil {
		return err // selects nothing it can name: nothing to close
	}
	if dirErr != nil {
		// Unknown policyTypes: close both directions of its subjects.
		ingress, egress = true, true
	}
	for _, pod := range subjects {
		ep := cp.res.Endpoints[pod.Key()]
		name := cp.policyName(p)
		if ingress {
			cp.enforce(ep, Ingress, name)
		}
		if egress {
			cp.enforce(ep, Egress, name)
		}
	}
	if dirErr != nil {
		return dirErr
	}
	var errs []error
	if ingress {
		for i, r := range p.Spec.Ingress {
			if err := cp.applyRule(p, Ingress, i, r.From, r.Ports, subjects); err != nil {
				errs = append(errs, fmt.Errorf("ingress[%d]: %w", i, err))
			}
		}
	}
	if egress {
		for i, r := range p.Spec.Egress {
			if err := cp.applyRule(p, Egress, i, r.To, r.Ports, subjects); err != nil {
				errs = append(errs, fmt.Errorf("egress[%d]: %w", i, err))
			}
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return nil
}

// policyName names a namespaced policy in EndpointPolicy.Policies:
// namespace/name for a NetworkPolicy, with its kind before it for a
// WeirNetworkPolicy.
func (cp *compilation) policyName(p *networkingv1.NetworkPolicy) string {
	if kind := cp.s.policyKind(p); kind != KindNetworkPolicy {
		return kind + "/" + p.Namespace + "/" + p.Name
	}
	return p.Namespace + "/" + p.Name
}

// closeSubjects enforces a refused policy's directions on its subjects
// with none of its rules: they fail closed, as for a policy Weir cannot
// read.
func (cp *compilation) closeSubjects(p *networkingv1.NetworkPolicy) {
	ingress, egress, err := policyDirections(p)
	if err != nil {
		ingress, egress = true, true
	}
	subjects, err := cp.subjects(p)
	if err != nil {
		return
	}
	name := cp.policyName(p)
	for _, pod := range subjects {
		ep := cp.res.Endpoints[pod.Key()]
		if ingress {
			cp.enforce(ep, Ingress, name)
		}
		if egress {
			cp.enforce(ep, Egress, name)
		}
	}
}

// enforce marks ep enforced in d. Enforcing ingress adds the node-traffic
// allowance: Kubernetes requires that a pod's own node can reach it
// (kubelet probes). Egress to the node has none: it is judged like any
// other peer, so an ipBlock over the node's address or a cluster policy's
// nodes peer allows it and an egress default deny denies it.
func (cp *compilation) enforce(ep *EndpointPolicy, d Direction, policy string) {
	if !ep.Enforced[d] {
		ep.Enforced[d] = true
		if d == Ingress {
			k := Key{Direction: Ingress, Peer: IdentityHost, Proto: ProtoAny}
			e := ep.Entries[k]
			e.Allow = RuleNodeTraffic
			ep.Entries[k] = e
			cp.res.Rules[RuleNodeTraffic] = RuleRef{Direction: Ingress}
		}
	}
	ep.Policies[d] = append(ep.Policies[d], policy)
}

// peerTarget is one peer a rule allows: an identity and what resolves
// named ports on egress: the label set's pods for a pod peer, the pod for
// the single-address prefix of a pod inside an ipBlock.
type peerTarget struct {
	id  Identity
	set *labelSet
	pod *Pod
}

// portSpec is one entry of a rule's ports, parsed.
type portSpec struct {
	proto uint8
	name  string // a named port, resolved per target
	ports []PortPrefix
}

func (cp *compilation) applyRule(p *networkingv1.NetworkPolicy, d Direction, index int,
	peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort, subjects []*Pod) error {
	if len(subjects) == 0 {
		return nil
	}
	targets, err := cp.peerTargets(p.Namespace, peers)
	if err != nil {
		return err
	}
	specs, err := parsePorts(ports)
	if err != nil {
		return err
	}
	http := cp.s.HTTP[p]
	if err := checkHTTPPorts(http, d, index, ports); err != nil {
		return err
	}
	ref := RuleRef{Kind: cp.s.policyKind(p), Namespace: p.Namespace, Name: p.Name, Direction: d, Index: index}
	rule := RuleID(cp.c.rules.get(ref))
	used := false
	for j, spec := range specs {
		set := HTTPSetID(0)
		if len(ports) > 0 {
			set = cp.http.portSet(rule, j, http.rules(d, index, j))
		}
		for _, subj := range subjects {
			ep := cp.res.Endpoints[subj.Key()]
			for _, k := range ruleKeys(d, targets, []portSpec{spec}, subj, cp.sets, cp.cidrIDs) {
				used = true
				e := ep.Entries[k]
				if e.Allow == 0 {
					e.Allow, e.HTTP = rule, set
				} else {
					e.HTTP = cp.http.union(e.HTTP, set)
				}
				ep.Entries[k] = e
			}
		}
	}
	if used {
		cp.res.Rules[rule] = ref
		cp.usedRule[ref] = true
	}
	return nil
}

// peerTargets resolves a rule's peers. No peers means any peer at all.
func (cp *compilation) peerTargets(policyNS string, peers []networkingv1.NetworkPolicyPeer) ([]peerTarget, error) {
	if len(peers) == 0 {
		return []peerTarget{{id: IdentityAny}}, nil
	}
	var out []peerTarget
	for _, peer := range peers {
		switch {
		case peer.IPBlock != nil:
			if peer.PodSelector != nil || peer.NamespaceSelector != nil {
				return nil, fmt.Errorf("ipBlock with a selector: %w", ErrInvalidPolicy)
			}
			targets, err := cp.ipBlockTargets(peer.IPBlock)
			if err != nil {
				return nil, err
			}
			out = append(out, targets...)
		case peer.PodSelector != nil || peer.NamespaceSelector != nil:
			sets, err := cp.selector.selectPeers(policyNS, peer.NamespaceSelector, peer.PodSelector)
			if err != nil {
				return nil, err
			}
			for _, s := range sets {
				if s.id != 0 {
					out = append(out, peerTarget{id: s.id, set: s})
				}
			}
		default:
			return nil, fmt.Errorf("empty peer: %w", ErrInvalidPolicy)
		}
	}
	return out, nil
}

// ipBlockTargets returns the CIDR identities whose prefix lies inside the
// block's cidr and inside none of its excepts: exactly the longest matches
// of the addresses the block contains.
func (cp *compilation) ipBlockTargets(b *networkingv1.IPBlock) ([]peerTarget, error) {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return nil, fmt.Errorf("ipBlock cidr %q: %w", b.CIDR, ErrInvalidPolicy)
	}
	cidr = cidr.Masked()
	var except []netip.Prefix
	for _, e := range b.Except {
		ep, err := netip.ParsePrefix(e)
		if err != nil {
			return nil, fmt.Errorf("ipBlock except %q: %w", e, ErrInvalidPolicy)
		}
		except = append(except, ep.Masked())
	}
	var out []peerTarget
	for _, np := range within(cp.cidrs, cidr) {
		p, id := np.p, np.id
		excluded := false
		for _, e := range except {
			if prefixCovers(e, p) {
				excluded = true
				break
			}
		}
		if excluded {
			continue
		}
		t := peerTarget{id: id}
		if p.IsSingleIP() {
			t.pod = cp.podByIP[p.Addr()]
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out, nil
}

// prefixCovers reports whether outer contains all of inner.
func prefixCovers(outer, inner netip.Prefix) bool {
	return outer.Addr().BitLen() == inner.Addr().BitLen() &&
		outer.Bits() <= inner.Bits() && outer.Contains(inner.Addr())
}

func parsePorts(ports []networkingv1.NetworkPolicyPort) ([]portSpec, error) {
	if len(ports) == 0 {
		return []portSpec{{proto: ProtoAny, ports: []PortPrefix{AllPorts}}}, nil
	}
	out := make([]portSpec, 0, len(ports))
	for _, p := range ports {
		proto, err := protoNumber(p.Protocol)
		if err != nil {
			return nil, err
		}
		spec := portSpec{proto: proto}
		switch {
		case p.Port == nil:
			spec.ports = []PortPrefix{AllPorts}
		case p.Port.Type == intstr.String:
			if p.EndPort != nil {
				return nil, fmt.Errorf("endPort with named port %q: %w", p.Port.StrVal, ErrInvalidPolicy)
			}
			spec.name = p.Port.StrVal
		default:
			lo := p.Port.IntVal
			hi := lo
			if p.EndPort != nil {
				hi = *p.EndPort
			}
			if lo < 1 || hi > 65535 || hi < lo {
				return nil, fmt.Errorf("port range %d-%d: %w", lo, hi, ErrInvalidPolicy)
			}
			spec.ports = RangePrefixes(uint16(lo), uint16(hi))
		}
		out = append(out, spec)
	}
	return out, nil
}

// ruleKeys expands one rule for one subject. Named ports resolve against
// the subject on ingress and against each peer pod on egress; an address
// peer (ipBlock, or any peer) has no named ports of its own, so on egress
// a named port to "any peer" means every pod that declares it.
func ruleKeys(d Direction, targets []peerTarget, specs []portSpec, subj *Pod, sets []*labelSet, cidrIDs map[netip.Prefix]Identity) []Key {
	var out []Key
	for _, spec := range specs {
		if spec.name == "" {
			for _, t := range targets {
				for _, pp := range spec.ports {
					out = append(out, Key{d, t.id, spec.proto, pp})
				}
			}
			continue
		}
		if d == Ingress {
			port, proto, ok := namedPort(subj.Ports, spec.name, spec.proto)
			if !ok {
				continue
			}
			for _, t := range targets {
				out = append(out, Key{d, t.id, proto, PortPrefix{port, 16}})
			}
			continue
		}
		for _, t := range targets {
			for _, pod := range t.namedPortPods(sets) {
				port, proto, ok := namedPort(pod.Ports, spec.name, spec.proto)
				if !ok {
					continue
				}
				for _, id := range podPrefixIdentities(pod, cidrIDs) {
					out = append(out, Key{d, id, proto, PortPrefix{port, 16}})
				}
			}
		}
	}
	return out
}

// namedPortPods are the pods an egress named port resolves against for
// this target: the pod of a single-address prefix, the pods of a label
// set, every pod for any peer.
func (t peerTarget) namedPortPods(sets []*labelSet) []*Pod {
	switch {
	case t.pod != nil:
		return []*Pod{t.pod}
	case t.set != nil:
		return t.set.pods
	case t.id == IdentityAny:
		var out []*Pod
		for _, s := range sets {
			out = append(out, s.pods...)
		}
		return out
	}
	return nil
}

// podPrefixIdentities are the CIDR identities of a pod's own prefixes.
func podPrefixIdentities(pod *Pod, cidrIDs map[netip.Prefix]Identity) []Identity {
	var out []Identity
	for _, a := range pod.IPs {
		if id, ok := cidrIDs[netip.PrefixFrom(a, a.BitLen())]; ok {
			out = append(out, id)
		}
	}
	return out
}

// flatten gives each key what every shorter key covering it holds: the
// same peer and direction with a shorter port prefix, or any protocol. An
// LPM lookup returns only the longest key, so without this a port rule of
// one tier would hide a wider rule of another.
func flatten(entries map[Key]Entry, h *httpSets) map[Key]Entry {
	out := make(map[Key]Entry, len(entries))
	for k, e := range entries {
		if k.Proto != ProtoAny {
			for bits := int(k.Ports.Bits) - 1; bits >= 0; bits-- {
				up := Key{k.Direction, k.Peer, k.Proto, PortPrefix{maskPort(k.Ports.Port, uint8(bits)), uint8(bits)}}
				if o, ok := entries[up]; ok {
					e = e.merge(o, h)
				}
			}
			if o, ok := entries[Key{k.Direction, k.Peer, ProtoAny, AllPorts}]; ok {
				e = e.merge(o, h)
			}
		}
		out[k] = e
	}
	return out
}

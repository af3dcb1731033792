package policy

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/weirnet/weir/internal/l7"
)

// KindWeirNetworkPolicy is the namespaced kind with HTTP rules: a
// NetworkPolicy for L3 and L4, plus HTTP rules on its ports.
const KindWeirNetworkPolicy = "WeirNetworkPolicy"

// PolicyHTTP is what a WeirNetworkPolicy adds to the NetworkPolicy it is
// read as (Snapshot.HTTP): Ingress[i][j] are the HTTP rules of
// spec.ingress[i].ports[j], Egress likewise. A port without HTTP rules is
// L4 only; one with them allows the peers its rule names only requests
// one of them matches.
type PolicyHTTP struct {
	Ingress, Egress [][][]l7.Rule
}

// rules returns the HTTP rules of one port of one rule, nil for none.
func (h *PolicyHTTP) rules(d Direction, rule, port int) []l7.Rule {
	if h == nil {
		return nil
	}
	byRule := h.Ingress
	if d == Egress {
		byRule = h.Egress
	}
	if rule >= len(byRule) || port >= len(byRule[rule]) {
		return nil
	}
	return byRule[rule][port]
}

// HTTPRuleRef names one HTTP rule: the policy rule it belongs to, the
// index of its port in that rule's ports and its own index in the port's
// HTTP rules.
type HTTPRuleRef struct {
	Rule        RuleID
	Port, Index int
}

func (r HTTPRuleRef) compare(o HTTPRuleRef) int {
	if r.Rule != o.Rule {
		return int(r.Rule) - int(o.Rule)
	}
	if r.Port != o.Port {
		return r.Port - o.Port
	}
	return r.Index - o.Index
}

// HTTPSetID numbers a set of HTTP rules an allow is restricted to;
// 0 is no restriction. The Compiler numbers sets by what they hold (each
// rule's reference and content): a set keeps its number across compiles
// while it is unchanged, and a number once used never names another set,
// so the datapath can write a set once under its number and a
// connection judged against a number never meets other rules under it.
type HTTPSetID uint32

// httpSets interns the sets of one compilation in the Compiler's
// numbering.
type httpSets struct {
	res   *Result
	alloc *idAllocator[string]
	used  map[string]bool
	byKey map[string]HTTPSetID
}

func newHTTPSets(res *Result, alloc *idAllocator[string]) *httpSets {
	res.HTTPSets = map[HTTPSetID][]HTTPRuleRef{}
	res.HTTPRules = map[HTTPRuleRef]l7.Rule{}
	res.HTTPTiers = map[RuleID]TierHTTP{}
	return &httpSets{res: res, alloc: alloc, used: map[string]bool{}, byKey: map[string]HTTPSetID{}}
}

// intern returns the ID of the sorted set refs, whose rules are in
// res.HTTPRules, numbering it if new.
func (h *httpSets) intern(refs []HTTPRuleRef) HTTPSetID {
	var key strings.Builder
	for _, r := range refs {
		fmt.Fprintf(&key, "%d/%d/%d=%q", r.Rule, r.Port, r.Index, ruleKey(h.res.HTTPRules[r]))
		if t, ok := h.res.HTTPTiers[r.Rule]; ok {
			// A cluster rule's place and action are part of what the
			// set decides: a set whose rules moved is another set.
			fmt.Fprintf(&key, "@%d/%d/%d", t.Tier, t.Rank, t.Action)
		}
		key.WriteByte(',')
	}
	if id, ok := h.byKey[key.String()]; ok {
		return id
	}
	id := HTTPSetID(h.alloc.get(key.String()))
	h.byKey[key.String()] = id
	h.used[key.String()] = true
	h.res.HTTPSets[id] = refs
	return id
}

// ruleKey writes out everything a rule matches on.
func ruleKey(r l7.Rule) string {
	var b strings.Builder
	fmt.Fprintf(&b, "m=%q", r.Method)
	if r.Path != nil {
		fmt.Fprintf(&b, " p=%s:%q", r.Path.Type, r.Path.Value)
	}
	for _, h := range r.Hostnames {
		fmt.Fprintf(&b, " h=%q", h)
	}
	for _, h := range r.Headers {
		fmt.Fprintf(&b, " f=%s:%q:%q", h.Type, h.Name, h.Value)
	}
	return b.String()
}

// union joins two restrictions: either unrestricted is unrestricted.
func (h *httpSets) union(a, b HTTPSetID) HTTPSetID {
	if a == 0 || b == 0 {
		return 0
	}
	if a == b {
		return a
	}
	refs := append(slices.Clone(h.res.HTTPSets[a]), h.res.HTTPSets[b]...)
	slices.SortFunc(refs, HTTPRuleRef.compare)
	return h.intern(slices.CompactFunc(refs, func(x, y HTTPRuleRef) bool { return x == y }))
}

// portSet records one port's HTTP rules and returns their set, 0 for a
// port without any.
func (h *httpSets) portSet(rule RuleID, port int, rules []l7.Rule) HTTPSetID {
	if len(rules) == 0 {
		return 0
	}
	refs := make([]HTTPRuleRef, len(rules))
	for i, r := range rules {
		refs[i] = HTTPRuleRef{Rule: rule, Port: port, Index: i}
		h.res.HTTPRules[refs[i]] = r
	}
	return h.intern(refs)
}

// TierHTTP is where a conditional cluster rule (one with HTTP rules)
// stands: its tier, and its place and action in the precedence order.
type TierHTTP struct {
	Tier Tier
	Match
}

// tierSet records a cluster rule's HTTP rules and returns their set, 0
// for a rule without any (unconditional).
func (h *httpSets) tierSet(m Match, t Tier, rules []l7.Rule) HTTPSetID {
	if len(rules) == 0 {
		return 0
	}
	h.res.HTTPTiers[m.Rule] = TierHTTP{Tier: t, Match: m}
	refs := make([]HTTPRuleRef, len(rules))
	for i, r := range rules {
		refs[i] = HTTPRuleRef{Rule: m.Rule, Index: i}
		h.res.HTTPRules[refs[i]] = r
	}
	return h.intern(refs)
}

// compareTier orders the rules of conditional cluster rules by
// precedence: tier, rank, then the HTTP rule's own index.
func (r *Result) compareTier(a, b HTTPRuleRef) int {
	ta, tb := r.HTTPTiers[a.Rule], r.HTTPTiers[b.Rule]
	if ta.Tier != tb.Tier {
		return int(ta.Tier) - int(tb.Tier)
	}
	if ta.Rank != tb.Rank {
		return cmp.Compare(ta.Rank, tb.Rank)
	}
	return a.Index - b.Index
}

// unionTiers joins two sets of conditional cluster rules: every rule of
// both applies, in precedence order (0 is the empty set here, not an
// unrestricted one).
func (h *httpSets) unionTiers(a, b HTTPSetID) HTTPSetID {
	if a == 0 || a == b {
		return b
	}
	if b == 0 {
		return a
	}
	refs := append(slices.Clone(h.res.HTTPSets[a]), h.res.HTTPSets[b]...)
	slices.SortFunc(refs, h.res.compareTier)
	return h.intern(slices.CompactFunc(refs, func(x, y HTTPRuleRef) bool { return x == y }))
}

// finishTiers settles an entry's conditional cluster rules once the
// entries are flattened: it drops those its tier's first unconditional
// rule already hides (a rule after an Accept, Deny, Reject or Pass is
// never reached, nor is a Baseline rule where NetworkPolicy selects the
// endpoint, npEnforced), notes per tier the first left (Cond.First, any action)
// and the first that can let a request on (Cond.Open, Accept or Pass),
// and names the set the datapath judges the entry's requests by (L7):
// the NetworkPolicy restriction's rules and the conditional rules'.
func (h *httpSets) finishTiers(e Entry, npEnforced bool) Entry {
	e.Cond = [2]CondMatch{}
	if e.Tiers != 0 {
		var kept []HTTPRuleRef
		for _, ref := range h.res.HTTPSets[e.Tiers] {
			t := h.res.HTTPTiers[ref.Rule]
			if hidden := e.Tier[t.Tier]; (hidden.Found() && hidden.Rank < t.Rank) || (npEnforced && t.Tier == TierBaseline) {
				continue
			}
			kept = append(kept, ref)
			c := &e.Cond[t.Tier]
			if !c.First.Found() {
				c.First = t.Match
			}
			if !c.Open.Found() && (t.Action == ActionAccept || t.Action == ActionPass) {
				c.Open = t.Match
			}
		}
		e.Tiers = 0
		if len(kept) > 0 {
			e.Tiers = h.intern(kept)
		}
	}
	e.L7 = e.HTTP
	if e.Tiers != 0 {
		refs := slices.Clone(h.res.HTTPSets[e.Tiers])
		if e.HTTP != 0 {
			refs = append(refs, h.res.HTTPSets[e.HTTP]...)
		}
		e.L7 = h.intern(refs)
	}
	return e
}

// keepReferenced drops the sets no entry names (those only a union or
// a hidden rule passed through), so the datapath writes and numbers
// only what it judges by.
func (h *httpSets) keepReferenced(eps map[string]*EndpointPolicy) {
	named := map[HTTPSetID]bool{}
	for _, ep := range eps {
		for _, e := range ep.Entries {
			named[e.HTTP], named[e.Tiers], named[e.L7] = true, true, true
		}
	}
	for key, id := range h.byKey {
		if !named[id] {
			delete(h.used, key)
			delete(h.res.HTTPSets, id)
		}
	}
}

// checkHTTPPorts refuses HTTP rules the datapath could not hold to: on a
// port that is not one TCP port (a range, every port, UDP or SCTP), or
// rules the matcher refuses.
func checkHTTPPorts(h *PolicyHTTP, d Direction, index int, ports []networkingv1.NetworkPolicyPort) error {
	for j := range ports {
		rules := h.rules(d, index, j)
		if len(rules) == 0 {
			continue
		}
		p := ports[j]
		if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
			return fmt.Errorf("ports[%d]: HTTP rules on a %s port: %w", j, *p.Protocol, ErrInvalidPolicy)
		}
		if p.Port == nil || p.EndPort != nil {
			return fmt.Errorf("ports[%d]: HTTP rules need one port, by number or name, not a range or every port: %w", j, ErrInvalidPolicy)
		}
		if _, err := l7.Compile(rules); err != nil {
			return fmt.Errorf("ports[%d]: %w: %w", j, err, ErrInvalidPolicy)
		}
	}
	if n := len(ports); n == 0 && len(h.rules(d, index, 0)) > 0 {
		return fmt.Errorf("HTTP rules on a rule without ports: %w", ErrInvalidPolicy)
	}
	return nil
}

// policyKind is the kind a namespaced policy of the snapshot was written
// as: a WeirNetworkPolicy has an entry in Snapshot.HTTP.
func (s *Snapshot) policyKind(p *networkingv1.NetworkPolicy) string {
	if _, ok := s.HTTP[p]; ok {
		return KindWeirNetworkPolicy
	}
	return KindNetworkPolicy
}

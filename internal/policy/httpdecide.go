package policy

import (
	"net/netip"
	"slices"

	"github.com/weirnet/weir/internal/l7"
)

// HTTPDecision is the verdict on one request of a TCP connection.
type HTTPDecision struct {
	// Conn is the connection's decision, as Lookup gives it.
	Conn Decision
	// Restricted says the requests are judged one by one: conditional
	// cluster rules inspect the connection (Conn.Inspect), or
	// NetworkPolicy allowed it only through rules with HTTP rules on
	// its port.
	Restricted bool
	// Request is the request's own decision (Restricted only): the
	// precedence order walked again with the conditional rules whose
	// HTTP rules match the request.
	Request Decision
	// Allowed is the request's verdict.
	Allowed bool
	// Rule is the HTTP rule that decided the request (Restricted only):
	// of the conditional cluster rule that decided it, or of the
	// NetworkPolicy rule that allowed it; zero when a rule without HTTP
	// rules decided.
	Rule HTTPRuleRef
}

// LookupHTTP decides one request the way the datapath will: the
// connection's decision from the three longest-match entries (Lookup);
// when it is judged request by request, the precedence order again
// (decideRequest) with each tier's first conditional rule that matches
// the request taking the place of the tier's rule when it comes first,
// and at NetworkPolicy an entry that allows with no HTTP set allowing
// every request, otherwise one of the allowing entries' sets must match
// the request. It returns l7.ErrAmbiguousHeader for a request carrying
// twice a header a rule of the entries' sets names (answered 400).
func (r *Result) LookupHTTP(pod string, d Direction, peer netip.Addr, port uint16, req *l7.Request) (HTTPDecision, error) {
	ep, ok := r.Endpoints[pod]
	if !ok || (!ep.Enforced[d] && !ep.Tiered[d]) {
		return HTTPDecision{Conn: Decision{Verdict: VerdictAllow, Stage: StageUnenforced}, Allowed: true}, nil
	}
	found := ep.lookup(r, d, peer, ProtoTCP, port)
	out := HTTPDecision{Conn: Decide(ep.Enforced[d], found)}
	if !out.Conn.Allowed() {
		return out, nil
	}
	npRestricted := out.Conn.Stage == StageNetworkPolicy && r.HTTPSetsOf(pod, d, peer, port) != nil
	if !out.Conn.Inspect && !npRestricted {
		out.Allowed = true
		return out, nil
	}
	out.Restricted = true
	if err := r.refuseAmbiguous(found, req); err != nil {
		return out, err
	}
	out.Request, out.Rule = r.decideRequest(ep.Enforced[d], found, req)
	out.Allowed = out.Request.Allowed()
	return out, nil
}

// lookup finds the three entries the datapath looks up.
func (ep *EndpointPolicy) lookup(r *Result, d Direction, peer netip.Addr, proto uint8, port uint16) [3]*Entry {
	label, cidr := r.PeerIdentities(peer)
	var found [3]*Entry
	for i, id := range []Identity{label, cidr, IdentityAny} {
		if e, ok := ep.match(d, id, proto, port); ok {
			found[i] = &e
		}
	}
	return found
}

// refuseAmbiguous is the datapath's first check on a judged request:
// one carrying twice a header some rule of the entries' sets names is
// refused, whichever rule would have decided it.
func (r *Result) refuseAmbiguous(found [3]*Entry, req *l7.Request) error {
	var key [3]HTTPSetID
	for i, e := range found {
		if e != nil {
			key[i] = e.L7
		}
	}
	var m *l7.Matcher
	if r.matchers != nil {
		if c, ok := r.matchers.sets.Load(key); ok {
			m = c.(*l7.Matcher)
		}
	}
	if m == nil {
		var rules []l7.Rule
		for _, id := range key {
			for _, ref := range r.HTTPSets[id] {
				rules = append(rules, r.HTTPRules[ref])
			}
		}
		c, err := l7.Compile(rules)
		if err != nil {
			return err // refused at compile time; never here
		}
		m = c
		if r.matchers != nil {
			r.matchers.sets.Store(key, c)
		}
	}
	_, err := m.Match(req)
	return err
}

// decideRequest is Decide for one request: per tier, the first
// conditional rule across the entries whose HTTP rules match req takes
// the place of the tier's rule when it comes first (a Log among them is
// reported as a Log rule), and at NetworkPolicy the allowing entries'
// HTTP sets judge req. It returns the HTTP rule that decided, if any.
func (r *Result) decideRequest(npEnforced bool, found [3]*Entry, req *l7.Request) (Decision, HTTPRuleRef) {
	var d Decision
	var by HTTPRuleRef
	for _, tier := range []Tier{TierAdmin, TierBaseline} {
		if tier == TierBaseline && npEnforced {
			d = d.networkPolicy(found, false)
			if !d.Allowed() {
				return d, HTTPRuleRef{}
			}
			ref, allowed := r.networkPolicyRequest(found, req)
			if !allowed {
				d.Verdict, d.Stage, d.Rule = VerdictDeny, StageNetworkPolicyDefaultDeny, 0
			}
			return d, ref
		}
		m := bestOf(found, func(e *Entry) Match { return e.Tier[tier] })
		cond, ref := r.firstConditional(found, tier, req, false)
		if cond.before(m) {
			m, by = cond, ref
		}
		if d.Log == 0 {
			log := bestOf(found, func(e *Entry) Match { return e.Log[tier] })
			if cl, _ := r.firstConditional(found, tier, req, true); cl.before(log) {
				log = cl
			}
			if log.before(m) {
				d.Log = log.Rule
			}
		}
		switch m.Action {
		case ActionAccept, ActionDeny, ActionReject:
			return d.decided(stageOf(tier), m), by
		case ActionPass:
			d.Passed, by = m.Rule, HTTPRuleRef{}
		}
	}
	d.Verdict, d.Stage = VerdictAllow, StageDefault
	return d, HTTPRuleRef{}
}

// firstConditional is the first conditional rule of tier across the
// entries whose HTTP rules match req: Log rules when logs, else the
// others; and the HTTP rule that matched.
func (r *Result) firstConditional(found [3]*Entry, tier Tier, req *l7.Request, logs bool) (Match, HTTPRuleRef) {
	var best Match
	var by HTTPRuleRef
	for _, e := range found {
		if e == nil {
			continue
		}
		for _, ref := range r.HTTPSets[e.Tiers] {
			t := r.HTTPTiers[ref.Rule]
			if t.Tier != tier || (t.Action == ActionLog) != logs || !t.before(best) {
				continue
			}
			if r.ruleMatches(ref, req) {
				best, by = t.Match, ref
			}
		}
	}
	return best, by
}

// networkPolicyRequest judges req at NetworkPolicy: an allowing entry
// without an HTTP set allows every request; otherwise the first rule of
// the allowing entries' sets (in reference order) that matches allows.
func (r *Result) networkPolicyRequest(found [3]*Entry, req *l7.Request) (HTTPRuleRef, bool) {
	var refs []HTTPRuleRef
	for _, e := range found {
		if e == nil || e.Allow == 0 {
			continue
		}
		if e.HTTP == 0 {
			return HTTPRuleRef{}, true
		}
		refs = append(refs, r.HTTPSets[e.HTTP]...)
	}
	slices.SortFunc(refs, HTTPRuleRef.compare)
	for _, ref := range slices.Compact(refs) {
		if r.ruleMatches(ref, req) {
			return ref, true
		}
	}
	return HTTPRuleRef{}, false
}

// SetOrder places each rule of a set in the walk of the cluster tiers,
// as the datapath writes it beside the set (l7.SetOrder): a conditional
// cluster rule's HTTP rule has its tier, action and rank, a
// NetworkPolicy rule's none.
func (r *Result) SetOrder(id HTTPSetID) []l7.RuleOrder {
	refs := r.HTTPSets[id]
	out := make([]l7.RuleOrder, len(refs))
	for i, ref := range refs {
		if t, ok := r.HTTPTiers[ref.Rule]; ok {
			out[i] = l7.RuleOrder{Tier: uint8(t.Tier) + 1, Action: uint8(t.Action), Rank: t.Rank}
		}
	}
	return out
}

// TierFlowOf is what the datapath keeps of a connection's three entries
// for judging its requests (l7.JudgeTiers): per tier the first rule
// without HTTP rules and the first such Log rule, and NetworkPolicy's
// part: which entries allow, and whether one allows without HTTP rules.
// The connection's sets are the entries' L7 sets, in the same order.
func TierFlowOf(npEnforced bool, found [3]*Entry) l7.TierFlow {
	f := l7.TierFlow{NPEnforced: npEnforced}
	for t := range f.Base {
		m := bestOf(found, func(e *Entry) Match { return e.Tier[t] })
		log := bestOf(found, func(e *Entry) Match { return e.Log[t] })
		f.Base[t] = l7.TierMatch{Rule: uint32(m.Rule), Rank: m.Rank, Action: uint8(m.Action)}
		f.Log[t] = l7.TierMatch{Rule: uint32(log.Rule), Rank: log.Rank, Action: uint8(log.Action)}
	}
	for i, e := range found {
		if e != nil && e.Allow != 0 {
			f.NPAllow |= 1 << i
			f.NPOpen = f.NPOpen || e.HTTP == 0
		}
	}
	return f
}

// ConditionalRulesOf are the HTTP rules of the conditional cluster rules
// a TCP connection from peer to pod's port meets, in precedence order
// across the three entries the datapath finds.
func (r *Result) ConditionalRulesOf(pod string, d Direction, peer netip.Addr, port uint16) []HTTPRuleRef {
	ep, ok := r.Endpoints[pod]
	if !ok {
		return nil
	}
	var refs []HTTPRuleRef
	for _, e := range ep.lookup(r, d, peer, ProtoTCP, port) {
		if e != nil {
			refs = append(refs, r.HTTPSets[e.Tiers]...)
		}
	}
	slices.SortFunc(refs, r.compareTier)
	return slices.Compact(refs)
}

// HTTPSetsOf are the HTTP sets a TCP connection from peer to pod's port
// is judged against: those of the entries the datapath's three lookups
// find allowing it, when each names one; nil when one allows it with no
// HTTP set (unrestricted) or none allows it.
func (r *Result) HTTPSetsOf(pod string, d Direction, peer netip.Addr, port uint16) []HTTPSetID {
	ep, ok := r.Endpoints[pod]
	if !ok {
		return nil
	}
	label, cidr := r.PeerIdentities(peer)
	var sets []HTTPSetID
	for _, id := range []Identity{label, cidr, IdentityAny} {
		e, ok := ep.match(d, id, ProtoTCP, port)
		if !ok || e.Allow == 0 {
			continue
		}
		if e.HTTP == 0 {
			return nil
		}
		sets = append(sets, e.HTTP)
	}
	return sets
}

// HTTPOutcome is EvaluateHTTP's answer.
type HTTPOutcome struct {
	Conn Outcome
	// Request is the request's own decision (the connection's when it
	// is not judged request by request).
	Request             Outcome
	Restricted, Allowed bool
}

// EvaluateHTTP decides one request by reading the policies directly: the
// connection as Evaluate decides it; when conditional cluster rules
// inspect it, or NetworkPolicy allowed it only through rules with HTTP
// rules on the port, the request is judged on its own (evaluate with
// req): a conditional rule matches it when one of its HTTP rules does,
// and at NetworkPolicy every rule of every policy that selects target
// and allows the peer on that port counts: one whose matching port has
// no HTTP rules allows every request, the others allow the requests one
// of the port's HTTP rules matches.
func EvaluateHTTP(s *Snapshot, target *Pod, d Direction, peer netip.Addr, port uint16, req *l7.Request) (HTTPOutcome, error) {
	out := HTTPOutcome{Conn: Evaluate(s, target, d, peer, ProtoTCP, port)}
	out.Request = out.Conn
	if out.Conn.Verdict != VerdictAllow {
		return out, nil
	}
	npRestricted := out.Conn.Stage == StageNetworkPolicy && networkPolicyHTTPRules(s, target, d, peer, port) != nil
	if !out.Conn.Inspect && !npRestricted {
		out.Allowed = true
		return out, nil
	}
	out.Restricted = true
	out.Request = evaluate(s, target, d, peer, ProtoTCP, port, req)
	out.Allowed = out.Request.Verdict == VerdictAllow
	if out.Request.Stage == StageNetworkPolicyDefaultDeny || out.Request.Stage == StageNetworkPolicy {
		// The one error a request can meet: a header an allowing rule
		// names, twice (answered 400).
		if rules := networkPolicyHTTPRules(s, target, d, peer, port); rules != nil {
			m, err := l7.Compile(rules)
			if err != nil {
				return out, err
			}
			if _, err := m.Match(req); err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// networkPolicyAllowsRequest reports whether NetworkPolicy allows req
// on a connection it allows: a rule allowing the connection with no HTTP
// rules on the port allows every request, the others those one of the
// port's HTTP rules matches.
func networkPolicyAllowsRequest(s *Snapshot, target *Pod, d Direction, peer netip.Addr, port uint16, req *l7.Request) bool {
	rules := networkPolicyHTTPRules(s, target, d, peer, port)
	return rules == nil || httpRulesMatch(rules, req)
}

// networkPolicyHTTPRules are the HTTP rules NetworkPolicy restricts a
// connection it allows to: nil when it allows the connection through a
// rule without HTTP rules on the port (or from the pod's own node).
func networkPolicyHTTPRules(s *Snapshot, target *Pod, d Direction, peer netip.Addr, port uint16) []l7.Rule {
	if d == Ingress && slices.Contains(s.HostIPs, peer) {
		return nil
	}
	peerPod := podByIP(s, peer)
	rules := []l7.Rule{}
	for _, p := range sortedPolicies(s.Policies) {
		if !policySelects(s, p, target, d) {
			continue
		}
		for i, r := range rulesOf(p, d) {
			if !peersMatch(s, p.Namespace, r.peers, peer, peerPod) {
				continue
			}
			if len(r.ports) == 0 {
				return nil
			}
			for j := range r.ports {
				if !portsMatch(r.ports[j:j+1], d, target, peerPod, ProtoTCP, port) {
					continue
				}
				http := s.HTTP[p].rules(d, i, j)
				if len(http) == 0 {
					return nil
				}
				rules = append(rules, http...)
			}
		}
	}
	return rules
}

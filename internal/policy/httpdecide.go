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
	// Restricted says HTTP rules apply: NetworkPolicy allowed the
	// connection, and only through rules with HTTP rules on its port.
	Restricted bool
	// Allowed is the request's verdict.
	Allowed bool
	// Rule is the HTTP rule that allowed the request (Restricted and
	// Allowed only).
	Rule HTTPRuleRef
}

// LookupHTTP decides one request the way the datapath will: the
// connection's decision from the three longest-match entries (Lookup);
// when NetworkPolicy allowed it, an entry that allows with no HTTP set
// allows every request, and otherwise the request must match a rule of
// one of the entries' sets. It returns l7.ErrAmbiguousHeader for a
// request carrying twice a header one of those rules names (answered
// 400).
func (r *Result) LookupHTTP(pod string, d Direction, peer netip.Addr, port uint16, req *l7.Request) (HTTPDecision, error) {
	ep, ok := r.Endpoints[pod]
	if !ok || (!ep.Enforced[d] && !ep.Tiered[d]) {
		return HTTPDecision{Conn: Decision{Verdict: VerdictAllow, Stage: StageUnenforced}, Allowed: true}, nil
	}
	label, cidr := r.PeerIdentities(peer)
	var found [3]*Entry
	for i, id := range []Identity{label, cidr, IdentityAny} {
		if e, ok := ep.match(d, id, ProtoTCP, port); ok {
			found[i] = &e
		}
	}
	out := HTTPDecision{Conn: Decide(ep.Enforced[d], found)}
	if !out.Conn.Allowed() || out.Conn.Stage != StageNetworkPolicy {
		out.Allowed = out.Conn.Allowed()
		return out, nil
	}
	sets := r.HTTPSetsOf(pod, d, peer, port)
	if sets == nil {
		out.Allowed = true
		return out, nil
	}
	out.Restricted = true
	var refs []HTTPRuleRef
	for _, id := range sets {
		refs = append(refs, r.HTTPSets[id]...)
	}
	slices.SortFunc(refs, HTTPRuleRef.compare)
	refs = slices.Compact(refs)
	rules := make([]l7.Rule, len(refs))
	for i, ref := range refs {
		rules[i] = r.HTTPRules[ref]
	}
	m, err := l7.Compile(rules)
	if err != nil {
		return out, err // refused at compile time; never here
	}
	i, err := m.Match(req)
	if err != nil || i < 0 {
		return out, err
	}
	out.Allowed, out.Rule = true, refs[i]
	return out, nil
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
	Conn                Outcome
	Restricted, Allowed bool
}

// EvaluateHTTP decides one request by reading the policies directly: the
// connection as Evaluate decides it; when a NetworkPolicy or
// WeirNetworkPolicy rule allowed it, every rule of every policy that
// selects target and allows the peer on that port counts: one whose
// matching port has no HTTP rules allows every request, the others allow
// the requests one of the port's HTTP rules matches.
func EvaluateHTTP(s *Snapshot, target *Pod, d Direction, peer netip.Addr, port uint16, req *l7.Request) (HTTPOutcome, error) {
	out := HTTPOutcome{Conn: Evaluate(s, target, d, peer, ProtoTCP, port)}
	if out.Conn.Verdict != VerdictAllow || out.Conn.Stage != StageNetworkPolicy || (d == Ingress && slices.Contains(s.HostIPs, peer)) {
		out.Allowed = out.Conn.Verdict == VerdictAllow
		return out, nil
	}
	peerPod := podByIP(s, peer)
	var rules []l7.Rule
	for _, p := range sortedPolicies(s.Policies) {
		if !policySelects(s, p, target, d) {
			continue
		}
		for i, r := range rulesOf(p, d) {
			if !peersMatch(s, p.Namespace, r.peers, peer, peerPod) {
				continue
			}
			if len(r.ports) == 0 {
				out.Allowed = true
				return out, nil
			}
			for j := range r.ports {
				if !portsMatch(r.ports[j:j+1], d, target, peerPod, ProtoTCP, port) {
					continue
				}
				http := s.HTTP[p].rules(d, i, j)
				if len(http) == 0 {
					out.Allowed = true
					return out, nil
				}
				rules = append(rules, http...)
			}
		}
	}
	out.Restricted = true
	m, err := l7.Compile(rules)
	if err != nil {
		return out, err
	}
	i, err := m.Match(req)
	out.Allowed = err == nil && i >= 0
	return out, err
}

package policy

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"

	"github.com/weirnet/weir/internal/l7"
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

// RuleNodeTraffic is the implicit ingress rule that lets a pod's own node
// reach it, which Kubernetes requires whatever the policies say. It is
// ingress only: a pod's egress to its node is judged by egress rules.
const RuleNodeTraffic RuleID = 1

// RuleRef names the rule a RuleID stands for.
type RuleRef struct {
	// Kind is KindNetworkPolicy or one of the cluster kinds; empty only
	// for the implicit node-traffic rule.
	Kind      string
	Namespace string // NetworkPolicy only
	Name      string
	Direction Direction
	// Index is the rule's position in spec.ingress or spec.egress.
	Index int
	// Cluster policies only: where the rule stands and what it does.
	Tier     Tier
	Priority int32
	Action   Action
	RuleName string // the rule's optional name field
}

// Cluster reports whether the rule comes from a cluster-scoped kind.
func (r RuleRef) Cluster() bool {
	return r.Kind == KindClusterNetworkPolicy || r.Kind == KindWeirClusterNetworkPolicy
}

func (r RuleRef) String() string {
	switch {
	case r.Name == "":
		return "node traffic: ingress from the pod's own node (always allowed)"
	case r.Cluster():
		s := fmt.Sprintf("%s %s (%s tier, priority %d) %s[%d]", strings.ToLower(r.Kind), r.Name, r.Tier, r.Priority, r.Direction, r.Index)
		if r.RuleName != "" {
			s += fmt.Sprintf(" %q", r.RuleName)
		}
		return s + " " + r.Action.String()
	}
	return fmt.Sprintf("%s %s/%s %s[%d]", strings.ToLower(r.Kind), r.Namespace, r.Name, r.Direction, r.Index)
}

// Match is a cluster policy rule found for a key: the rule, its place in
// the precedence order (lower first) and its action.
type Match struct {
	Rule   RuleID
	Rank   uint32
	Action Action
}

// Found reports whether m holds a rule.
func (m Match) Found() bool { return m.Action != ActionNone }

// before reports whether m takes precedence over o.
func (m Match) before(o Match) bool {
	return m.Found() && (!o.Found() || m.Rank < o.Rank)
}

// Entry is what one Key holds: a NetworkPolicy rule that allows it, and
// per tier the first terminating rule and the first Log rule that match.
// The datapath's policy map value mirrors it.
type Entry struct {
	Allow RuleID
	// HTTP restricts Allow to requests one of a set of HTTP rules
	// matches (WeirNetworkPolicy); 0 restricts nothing. Where several
	// rules allow a key the set is their union, and one rule without HTTP
	// rules lifts the restriction, as NetworkPolicy's rules add up.
	HTTP HTTPSetID
	Tier [2]Match // by Tier: Accept, Deny, Reject or Pass
	Log  [2]Match // by Tier: Log rules
	// Tiers are the conditional cluster rules (ClusterHTTP) that match
	// the key and come before Tier's rule of their tier, as one set in
	// precedence order; 0 for none. Each decides only the requests one
	// of its HTTP rules matches.
	Tiers HTTPSetID
	// Cond is, per tier, what the connection's decision needs of Tiers.
	Cond [2]CondMatch
	// L7 is the set the datapath judges the key's requests by: HTTP's
	// rules and Tiers' (HTTP when Tiers is 0).
	L7 HTTPSetID
}

// CondMatch is what a tier's conditional rules mean for a connection:
// the first in precedence (First) and the first that lets a request on
// (Open: Accept, or Pass). A connection one of them comes before the
// tier's decision for is judged request by request (Decision.Inspect);
// one whose tier would deny it is still let on when Open comes first.
type CondMatch struct {
	First, Open Match
}

// merge folds o (a key covering this one) into e: the allow of the
// longest key stands, its HTTP restriction joined with the covering
// key's, per tier the rule first in precedence, and every conditional
// rule of both.
func (e Entry) merge(o Entry, h *httpSets) Entry {
	switch {
	case e.Allow == 0:
		e.Allow, e.HTTP = o.Allow, o.HTTP
	case o.Allow != 0:
		e.HTTP = h.union(e.HTTP, o.HTTP)
	}
	e.Tiers = h.unionTiers(e.Tiers, o.Tiers)
	for t := range e.Tier {
		if o.Tier[t].before(e.Tier[t]) {
			e.Tier[t] = o.Tier[t]
		}
		if o.Log[t].before(e.Log[t]) {
			e.Log[t] = o.Log[t]
		}
	}
	return e
}

// EndpointPolicy is the compiled policy of one local endpoint.
type EndpointPolicy struct {
	Pod      string // namespace/name
	Identity Identity
	// Enforced[d] is set when some NetworkPolicy selects the endpoint
	// for d: traffic no NetworkPolicy rule allows is then denied unless
	// the Admin tier decided first.
	Enforced [2]bool
	// Tiered[d] is set when some cluster policy selects the endpoint for
	// d. With neither flag every packet in d is allowed and Entries holds
	// no d keys.
	Tiered [2]bool
	// Entries maps each key to what decides it. Each entry already holds
	// what every shorter key covering it holds (see Entry.merge), so the
	// longest match alone decides, as in the datapath's LPM trie.
	Entries map[Key]Entry
	// Policies selecting the endpoint, by direction: NetworkPolicies as
	// namespace/name, cluster policies as kind/name.
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
	// HTTPSets holds every HTTP set an Entry names, each sorted, and
	// HTTPRules the rules they name.
	HTTPSets  map[HTTPSetID][]HTTPRuleRef
	HTTPRules map[HTTPRuleRef]l7.Rule
	// HTTPTiers are the conditional cluster rules the sets name, by ID.
	HTTPTiers map[RuleID]TierHTTP
	// Unallocated lists label set keys seen on pods that have no cluster
	// identity yet, sorted.
	Unallocated []string
	// Errors are policies that could not be compiled. Their subjects stay
	// enforced in the policy's directions with none of its rules: closed.
	Errors []error

	// matchers keeps the HTTP rules compiled as LookupHTTP meets them
	// (nil in a Result not made by a Compiler: it compiles each time).
	matchers *httpMatchers
}

// httpMatchers caches compiled matchers of a Result's HTTP rules: the
// node's proxy calls LookupHTTP for every request of a flow with
// conditional cluster rules, and compiling the rules (their regular
// expressions) per request would cost more than the request. A Result
// never changes, so neither do its matchers.
type httpMatchers struct {
	rules sync.Map // HTTPRuleRef -> *l7.Matcher, nil for a rule the matcher refuses
	sets  sync.Map // [3]HTTPSetID -> *l7.Matcher of the sets' rules together
}

// ruleMatches says whether HTTP rule ref matches req.
func (r *Result) ruleMatches(ref HTTPRuleRef, req *l7.Request) bool {
	if r.matchers == nil {
		return httpRulesMatch([]l7.Rule{r.HTTPRules[ref]}, req)
	}
	m, ok := r.matchers.rules.Load(ref)
	if !ok {
		c, err := l7.Compile([]l7.Rule{r.HTTPRules[ref]})
		if err != nil {
			c = nil
		}
		m, _ = r.matchers.rules.LoadOrStore(ref, c)
	}
	c := m.(*l7.Matcher)
	if c == nil {
		return false
	}
	i, err := c.Match(req)
	return err == nil && i >= 0
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

// Lookup decides a packet the way the datapath does: a direction with no
// policy allows; otherwise the entries of the peer's label identity, its
// CIDR identity and the wildcard (each the longest matching key) are
// combined by Decide.
func (r *Result) Lookup(pod string, d Direction, peer netip.Addr, proto uint8, port uint16) Decision {
	ep, ok := r.Endpoints[pod]
	if !ok || (!ep.Enforced[d] && !ep.Tiered[d]) {
		return Decision{Verdict: VerdictAllow, Stage: StageUnenforced}
	}
	label, cidr := r.PeerIdentities(peer)
	var found [3]*Entry
	for i, id := range []Identity{label, cidr, IdentityAny} {
		if e, ok := ep.match(d, id, proto, port); ok {
			found[i] = &e
		}
	}
	return Decide(ep.Enforced[d], found)
}

// match finds the longest key for (d, id, proto, port), as an LPM trie
// whose key ends in protocol then port would.
func (ep *EndpointPolicy) match(d Direction, id Identity, proto uint8, port uint16) (Entry, bool) {
	for bits := 16; bits >= 0; bits-- {
		p := PortPrefix{Port: maskPort(port, uint8(bits)), Bits: uint8(bits)}
		if e, ok := ep.Entries[Key{d, id, proto, p}]; ok {
			return e, true
		}
	}
	e, ok := ep.Entries[Key{d, id, ProtoAny, AllPorts}]
	return e, ok
}

// maskPort keeps the top bits of port.
func maskPort(port uint16, bits uint8) uint16 {
	if bits == 0 {
		return 0
	}
	return port &^ (1<<(16-bits) - 1)
}

// KernelTier is the tier match the datapath writes for e, which judges
// the connection's decision without conditional rules: the earlier of
// the tier's first rule without HTTP rules and its first conditional
// Accept or Pass, the latter as an Accept (such a rule coming first lets
// the connection on, as Decide says). Taken first in precedence across
// the three entries, it gives Decide's verdict, stage, deciding and Log
// rules; what it cannot say, whether the requests are then judged one by
// one, the datapath learns from the entry's set (TieredSet), and judges
// every request of such a flow in user space.
func (e Entry) KernelTier(t Tier) Match {
	m := e.Tier[t]
	if open := e.Cond[t].Open; open.before(m) {
		return Match{Rule: open.Rule, Rank: open.Rank, Action: ActionAccept}
	}
	return m
}

// TieredSet says whether HTTP set id holds conditional cluster rules
// (Entry.Tiers, and the Entry.L7 that joins them): whether one decides a
// request depends on its place in the precedence order, so such a set is
// never judged by its rules alone.
func (r *Result) TieredSet(id HTTPSetID) bool {
	for _, ref := range r.HTTPSets[id] {
		if r.HTTPTiers[ref.Rule].Found() {
			return true
		}
	}
	return false
}

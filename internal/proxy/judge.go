package proxy

import (
	"errors"
	"net/netip"
	"sync"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/policy"
)

// SetJudge judges requests with the full matcher of each kernel HTTP set
// (regular expressions included), by the sets' kernel numbers, as lookup
// gives them. A set lookup has no matcher for allows nothing, as a set
// not written does in the kernel.
type SetJudge struct {
	lookup func(set uint32) *l7.Matcher
}

// NewSetJudge judges with the matchers lookup gives.
func NewSetJudge(lookup func(set uint32) *l7.Matcher) *SetJudge {
	return &SetJudge{lookup: lookup}
}

// Judge decides r as l7_judge_sets does, in the sets' order: refused by
// the first set that finds it ambiguous before one allows it, allowed by
// the first that allows it, else denied; sets all 0 allow all.
func (j *SetJudge) Judge(c Conn, r *l7.Request) Decision {
	sets := c.Sets
	if sets == [3]uint32{} {
		return Decision{Verdict: Allow}
	}
	for _, id := range sets {
		if id == 0 {
			continue
		}
		m := j.lookup(id)
		if m == nil {
			continue
		}
		i, err := m.Match(r)
		if errors.Is(err, l7.ErrAmbiguousHeader) {
			return Decision{Verdict: Refuse}
		}
		if i >= 0 {
			return Decision{Verdict: Allow, Set: id, Rule: i}
		}
	}
	return Decision{Verdict: Deny}
}

// HeaderNames are the names the sets' rules match on.
func (j *SetJudge) HeaderNames(c Conn) []string {
	var names []string
	for _, id := range c.Sets {
		if id == 0 {
			continue
		}
		if m := j.lookup(id); m != nil {
			names = append(names, m.HeaderNames()...)
		}
	}
	return names
}

// Matchers is a table of matchers by kernel set number, safe for
// concurrent use: a SetJudge's lookup for sets written as they come.
type Matchers struct {
	mu   sync.RWMutex
	sets map[uint32]*l7.Matcher
}

// Put gives set id its matcher.
func (t *Matchers) Put(id uint32, m *l7.Matcher) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sets == nil {
		t.sets = map[uint32]*l7.Matcher{}
	}
	t.sets[id] = m
}

// Delete forgets set id.
func (t *Matchers) Delete(id uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.sets, id)
}

// Get is set id's matcher, nil for none.
func (t *Matchers) Get(id uint32) *l7.Matcher {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.sets[id]
}

// PolicyView is the policy a TierJudge reads: the Result loaded now and
// the local endpoint (policy.Result.Endpoints' key) an address is, false
// when it is none.
type PolicyView func(local netip.Addr) (res *policy.Result, pod string, ok bool)

// TierJudge judges the requests of connections whose flow names a set
// with conditional cluster rules (datapath.TieredSets) against the whole
// policy, walking the precedence order for each request
// (policy.Result.LookupHTTP: the reference the compiler is held to), and
// other connections' with Sets.
type TierJudge struct {
	Sets   *SetJudge
	Policy PolicyView
}

// Judge decides r. A tiered connection whose local end (the server, or
// with Egress the client) is no longer a local endpoint, or which policy
// no longer allows, is denied: what cannot be judged is never allowed.
func (j *TierJudge) Judge(c Conn, r *l7.Request) Decision {
	if !datapath.TieredSets(c.Sets) {
		return j.Sets.Judge(c, r)
	}
	local, peer, dir := c.Server, c.Client.Addr(), policy.Ingress
	if c.Egress {
		local, peer, dir = c.Client, c.Server.Addr(), policy.Egress
	}
	res, pod, ok := j.Policy(local.Addr())
	if !ok || res == nil {
		return Decision{Verdict: Deny}
	}
	if _, ok := res.Endpoints[pod]; !ok {
		return Decision{Verdict: Deny}
	}
	d, err := res.LookupHTTP(pod, dir, peer, c.Server.Port(), r)
	switch {
	case errors.Is(err, l7.ErrAmbiguousHeader):
		return Decision{Verdict: Refuse, Policy: &d}
	case err != nil || !d.Allowed:
		return Decision{Verdict: Deny, Policy: &d}
	}
	return Decision{Verdict: Allow, Policy: &d}
}

// HeaderNames: a tiered connection's repeated headers are refused by
// LookupHTTP itself, across every rule that could decide the request.
func (j *TierJudge) HeaderNames(c Conn) []string {
	if datapath.TieredSets(c.Sets) {
		return nil
	}
	return j.Sets.HeaderNames(c)
}

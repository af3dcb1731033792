package l7

import (
	"fmt"
	"math/bits"
)

// The actions of the cluster tiers as the datapath numbers them
// (bpf/lib/policy.h ACTION_*, policy.Action).
const (
	ActionAccept uint8 = 1
	ActionDeny   uint8 = 2
	ActionPass   uint8 = 3
	ActionReject uint8 = 4
	ActionLog    uint8 = 5
)

// The steps of the precedence order as the datapath numbers them
// (bpf/lib/policy.h STAGE_*, policy.Stage).
const (
	StageAdmin             uint8 = 1
	StageNetworkPolicy     uint8 = 2
	StageNetworkPolicyDeny uint8 = 3
	StageBaseline          uint8 = 4
	StageDefault           uint8 = 5
)

// Tiers a set's rule can stand in (RuleOrder.Tier).
const (
	TierNone     uint8 = 0 // a NetworkPolicy rule: unordered, judged at NetworkPolicy
	TierAdmin    uint8 = 1
	TierBaseline uint8 = 2
)

// RuleOrder places one rule of a set in the walk of the cluster tiers:
// a rule of a conditional cluster rule has its tier, its rule's action
// and precedence rank; a NetworkPolicy rule has none.
type RuleOrder struct {
	Tier   uint8
	Action uint8
	Rank   uint32
}

// SetOrder is a set's rules' places as the kernel holds them: masks by
// tier and by action, and each rule's rank. Rules of one tier are
// numbered in precedence order, so the lowest bit of a mask of them is
// the first.
type SetOrder struct {
	Tier                            [2]uint64 // Admin, Baseline
	Accept, Deny, Pass, Reject, Log uint64
	Rank                            [MaxKernelRules]uint32
}

// NewSetOrder builds a set's order from its rules' (order[i] is rule
// i's); nil or all TierNone is a NetworkPolicy set.
func NewSetOrder(order []RuleOrder) (SetOrder, error) {
	var o SetOrder
	if len(order) > MaxKernelRules {
		return o, fmt.Errorf("%w: %d rules, at most %d", ErrTooManyRules, len(order), MaxKernelRules)
	}
	last := [2]int64{-1, -1}
	for i, r := range order {
		bit := uint64(1) << i
		if r.Tier == TierNone {
			continue
		}
		if r.Tier > TierBaseline {
			return o, fmt.Errorf("rule %d: tier %d", i, r.Tier)
		}
		t := r.Tier - 1
		if int64(r.Rank) < last[t] {
			return o, fmt.Errorf("rule %d: rank %d after %d: a tier's rules must come in precedence order", i, r.Rank, last[t])
		}
		last[t] = int64(r.Rank)
		o.Tier[t] |= bit
		o.Rank[i] = r.Rank
		switch r.Action {
		case ActionAccept:
			o.Accept |= bit
		case ActionDeny:
			o.Deny |= bit
		case ActionPass:
			o.Pass |= bit
		case ActionReject:
			o.Reject |= bit
		case ActionLog:
			o.Log |= bit
		default:
			return o, fmt.Errorf("rule %d: action %d", i, r.Action)
		}
	}
	return o, nil
}

func (o *SetOrder) action(bit int) uint8 {
	m := uint64(1) << bit
	switch {
	case o.Accept&m != 0:
		return ActionAccept
	case o.Deny&m != 0:
		return ActionDeny
	case o.Pass&m != 0:
		return ActionPass
	case o.Reject&m != 0:
		return ActionReject
	}
	return ActionLog
}

// TierMatch is a rule found for a connection (bpf tier_match): its ID,
// its rank and its action; Action 0 is none.
type TierMatch struct {
	Rule, Rank uint32
	Action     uint8
}

func (m TierMatch) before(o TierMatch) bool {
	return m.Action != 0 && (o.Action == 0 || m.Rank < o.Rank)
}

// TierFlow is what a connection's decision left for judging its
// requests (policy.Decide's inputs, reduced): per tier the first rule
// without HTTP rules (Base) and first Log rule without them; whether a
// NetworkPolicy selects the endpoint, which of the three lookups' entries
// allow at NetworkPolicy (NPAllow, a bit each) and whether one of them
// allows without HTTP rules (NPOpen).
type TierFlow struct {
	Base, Log  [2]TierMatch
	NPEnforced bool
	NPAllow    uint8
	NPOpen     bool
}

// TierSet is one of a connection's three sets in a walk: the rules a
// request may match (Cand), those of them only user space can confirm
// (UserSpace: the kernel cannot judge a condition of theirs), and the
// set's order.
type TierSet struct {
	Cand, UserSpace uint64
	Order           *SetOrder
}

// TierVerdict is the walk's decision on a request.
type TierVerdict struct {
	Verdict KernelVerdict
	Stage   uint8
	// Action is the deciding cluster rule's (0 at NetworkPolicy and by
	// default), Rule its ID when it has no HTTP rules (Base).
	Action uint8
	Rule   uint32
	// Set and Bit name the HTTP rule that decided: the set's index in
	// the walk and the rule's bit; -1 when none did.
	Set, Bit int
	// Log names the first Log rule passed: LogRule one without HTTP
	// rules, else LogSet and LogBit (-1: none).
	LogRule        uint32
	LogSet, LogBit int
}

// JudgeTiers walks the precedence order for one request (the kernel's
// l7_judge_tiers, policy.Result.LookupHTTP): per tier, the first rule in
// precedence among the tier's rule without HTTP rules and the
// conditional rules the request may match, in every set; when that
// first is one only user space can confirm, user space judges the
// request (KernelUserSpace). At NetworkPolicy an entry allowing without
// HTTP rules allows every request; else the allowing entries' sets'
// NetworkPolicy rules judge it as l7_judge_sets does. A request any set
// refuses is refused before the walk (the caller's part).
func JudgeTiers(f TierFlow, sets [3]*TierSet) TierVerdict {
	v := TierVerdict{Set: -1, Bit: -1, LogSet: -1, LogBit: -1}
	logged := false
	for t := 0; t < 2; t++ {
		if t == 1 && f.NPEnforced {
			return judgeNetworkPolicy(f, sets, v)
		}
		m, log := f.Base[t], f.Log[t]
		by, logBy := [2]int{-1, -1}, [2]int{-1, -1}
		userSpace := false
		for i, s := range sets {
			if s == nil {
				continue
			}
			c := s.Cand & s.Order.Tier[t]
			if d := c &^ s.Order.Log; d != 0 {
				b := bits.TrailingZeros64(d)
				if cm := (TierMatch{Rank: s.Order.Rank[b], Action: s.Order.action(b)}); cm.before(m) {
					m, by, userSpace = cm, [2]int{i, b}, s.UserSpace&(1<<b) != 0
				}
			}
			// A Log rule only user space could confirm is not reported.
			if l := c & s.Order.Log &^ s.UserSpace; l != 0 {
				b := bits.TrailingZeros64(l)
				if cm := (TierMatch{Rank: s.Order.Rank[b], Action: ActionLog}); cm.before(log) {
					log, logBy = cm, [2]int{i, b}
				}
			}
		}
		if userSpace {
			return TierVerdict{Verdict: KernelUserSpace, Set: -1, Bit: -1, LogSet: -1, LogBit: -1}
		}
		if !logged && log.before(m) {
			logged = true
			v.LogRule, v.LogSet, v.LogBit = log.Rule, logBy[0], logBy[1]
		}
		stage := StageAdmin
		if t == 1 {
			stage = StageBaseline
		}
		switch m.Action {
		case ActionAccept, ActionDeny, ActionReject:
			v.Verdict = KernelAllow
			if m.Action != ActionAccept {
				v.Verdict = KernelDeny
			}
			v.Stage, v.Action, v.Rule, v.Set, v.Bit = stage, m.Action, m.Rule, by[0], by[1]
			return v
		}
	}
	v.Verdict, v.Stage = KernelAllow, StageDefault
	return v
}

// judgeNetworkPolicy is the walk's NetworkPolicy step.
func judgeNetworkPolicy(f TierFlow, sets [3]*TierSet, v TierVerdict) TierVerdict {
	v.Stage = StageNetworkPolicy
	switch {
	case f.NPAllow == 0:
		v.Verdict, v.Stage = KernelDeny, StageNetworkPolicyDeny
		return v
	case f.NPOpen:
		v.Verdict = KernelAllow
		return v
	}
	userSpace := false
	for i, s := range sets {
		if s == nil || f.NPAllow&(1<<i) == 0 {
			continue
		}
		np := s.Cand &^ (s.Order.Tier[0] | s.Order.Tier[1])
		if k := np &^ s.UserSpace; k != 0 {
			v.Verdict, v.Set, v.Bit = KernelAllow, i, bits.TrailingZeros64(k)
			return v
		}
		userSpace = userSpace || np != 0
	}
	if userSpace {
		return TierVerdict{Verdict: KernelUserSpace, Set: -1, Bit: -1, LogSet: -1, LogBit: -1}
	}
	v.Verdict, v.Stage = KernelDeny, StageNetworkPolicyDeny
	return v
}

// Candidates are the rules the kernel finds r may match (KernelRules'
// lookups and automaton), those of them only user space can confirm,
// and whether r repeats a header the rules name (refused).
func (k *KernelRules) Candidates(r *Request) (cand, userSpace uint64, refuse bool) {
	lookup := func(kind KernelKeyKind, h uint64) uint64 { return k.Entries[KernelKey{kind, h}] }
	method := k.AnyMethod | lookup(KeyMethod, MethodHash(k.Key, r.Method))
	path := k.AnyPath &^ k.NeedsPath
	if r.Path != "" {
		path = k.AnyPath | lookup(KeyPathExact, PathHash(k.Key, r.Path)) | lookup(KeyPathPrefix, PathHash(k.Key, r.Path))
		for _, h := range PathPrefixHashes(k.Key, r.Path) {
			path |= lookup(KeyPathPrefix, h)
		}
		if k.PathDFA != nil {
			// A byte over 127 leaves the kernel's automaton dead, as
			// here (canonical paths have none).
			m, _ := k.PathDFA.Match(r.Path)
			path |= m
		}
	}
	host := k.AnyHost
	labels := HostLabelHashes(k.Key, r.Host)
	if len(labels) > 0 {
		host |= lookup(KeyHostExact, HostHash(labels))
		for i := 1; i < len(labels); i++ {
			host |= lookup(KeyHostSuffix, HostHash(labels[i:]))
		}
	}
	cand = method & path & host
	if k.HeaderRules != 0 {
		miss, refuse := k.headerMisses(r)
		if refuse {
			return 0, 0, true
		}
		cand &^= miss
	}
	return cand, cand & k.UserSpace, false
}

// Candidates are the rules r matches, one bit each (at most
// MaxKernelRules rules), as user space confirms them; an error for a
// request that repeats a header a rule names.
func (m *Matcher) Candidates(r *Request) (uint64, error) {
	if _, err := m.Match(r); err != nil {
		return 0, err
	}
	var c uint64
	for i := range m.rules {
		if i < MaxKernelRules && m.rules[i].matches(r) {
			c |= 1 << i
		}
	}
	return c, nil
}

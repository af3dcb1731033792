package policy

// Verdict is what happens to a packet.
type Verdict uint8

const (
	VerdictAllow Verdict = iota + 1
	// VerdictDeny drops silently.
	VerdictDeny
	// VerdictReject drops and answers the sender.
	VerdictReject
	// VerdictForwarded is no decision of policy: the datapath translated
	// a flow from outside the cluster to a Service's backend on another
	// node and sent it there, where that backend's policy judges it. Only
	// the datapath's reports carry it; no policy gives it.
	VerdictForwarded
)

func (v Verdict) String() string {
	switch v {
	case VerdictAllow:
		return "allowed"
	case VerdictDeny:
		return "denied"
	case VerdictReject:
		return "rejected"
	case VerdictForwarded:
		return "forwarded"
	}
	return "unknown"
}

// Stage is the step of the precedence order that decided a packet:
// Admin tier, NetworkPolicy, Baseline tier, default.
type Stage uint8

const (
	// StageUnenforced: no policy of any kind selects the endpoint in
	// that direction.
	StageUnenforced Stage = iota
	// StageAdmin: an Admin tier rule accepted, denied or rejected.
	StageAdmin
	// StageNetworkPolicy: a NetworkPolicy rule allowed.
	StageNetworkPolicy
	// StageNetworkPolicyDefaultDeny: NetworkPolicies select the endpoint
	// and none of their rules allows.
	StageNetworkPolicyDefaultDeny
	// StageBaseline: a Baseline tier rule accepted, denied or rejected.
	StageBaseline
	// StageDefault: cluster policies select the endpoint, none decided
	// (no match, or Pass), and no NetworkPolicy does: allowed.
	StageDefault
	// StageUnidentified: a policy selects the endpoint and the peer is a
	// pod address whose identity has not reached this node yet
	// (IdentityUnidentified): denied, since no rule can be known to allow
	// it. Only the datapath decides this; Decide is never asked.
	StageUnidentified
	// StageClosed: the endpoint's last policy load failed; it denies
	// everything until a load succeeds. Only the datapath decides this.
	StageClosed
)

var stageNames = [...]string{"unenforced", "admin", "networkpolicy", "networkpolicy-default-deny", "baseline", "default", "unidentified", "closed"}

func (s Stage) String() string {
	if int(s) < len(stageNames) {
		return stageNames[s]
	}
	return "unknown"
}

// Decision is the outcome for one packet and why.
type Decision struct {
	Verdict Verdict
	Stage   Stage
	// Rule is the deciding rule: an Admin or Baseline rule, or the
	// NetworkPolicy rule that allowed; 0 for the other stages.
	Rule RuleID
	// Log is the first Log rule the evaluation passed, 0 for none. Log
	// rules do not decide; evaluation goes on past them.
	Log RuleID
	// Passed is the Pass rule that sent evaluation on from the Admin
	// tier, or from the Baseline tier to the default.
	Passed RuleID
	// Inspect says conditional cluster rules (ClusterHTTP) judge the
	// connection's requests one by one; allowed connections only. When a
	// conditional Accept or Pass let the connection on, Rule is that rule.
	Inspect bool
}

// Allowed reports whether the packet goes on.
func (d Decision) Allowed() bool { return d.Verdict == VerdictAllow }

// Decide combines the longest-match entries of the peer's label identity,
// CIDR identity and the wildcard (nil where none matched) into the
// decision, in the precedence order:
//
//  1. Admin tier: the first rule in precedence across the three entries;
//     Accept, Deny and Reject decide, Pass goes on to 2.
//  2. NetworkPolicy, when one selects the endpoint (npEnforced): an allow
//     in any entry allows, none denies.
//  3. Baseline tier, as the Admin tier; Pass goes on to 4.
//  4. Allow.
//
// A Log rule is reported when it comes before the decision of its tier
// and its tier is reached. Conditional rules (Entry.Cond) decide only
// some requests, so they never decide a connection: one that comes
// first in its tier makes an allowed connection inspected (Inspect), and
// an Accept or Pass among them coming first lets the connection on,
// inspected, whatever the tier's own rule would have done. The datapath
// (bpf/lib/policy.h) runs the same steps on the same entries.
func Decide(npEnforced bool, found [3]*Entry) Decision {
	var d Decision
	inspect := false
	for _, tier := range []Tier{TierAdmin, TierBaseline} {
		if tier == TierBaseline {
			if npEnforced {
				return d.networkPolicy(found, inspect)
			}
		}
		m := bestOf(found, func(e *Entry) Match { return e.Tier[tier] })
		if open := bestOf(found, func(e *Entry) Match { return e.Cond[tier].Open }); open.before(m) {
			m = open
			d.Inspect = true
		}
		inspect = inspect || bestOf(found, func(e *Entry) Match { return e.Cond[tier].First }).before(m)
		if d.Log == 0 {
			d.Log = reachedLog(found, tier, m)
		}
		if d.Inspect {
			d.Verdict, d.Stage, d.Rule = VerdictAllow, stageOf(tier), m.Rule
			return d
		}
		switch m.Action {
		case ActionAccept, ActionDeny, ActionReject:
			d = d.decided(stageOf(tier), m)
			d.Inspect = inspect && d.Allowed()
			return d
		case ActionPass:
			d.Passed = m.Rule
		}
	}
	d.Verdict, d.Stage, d.Inspect = VerdictAllow, StageDefault, inspect
	return d
}

// networkPolicy is step 2: an allow in any entry allows, none denies.
func (d Decision) networkPolicy(found [3]*Entry, inspect bool) Decision {
	for _, e := range found {
		if e != nil && e.Allow != 0 {
			d.Verdict, d.Stage, d.Rule, d.Inspect = VerdictAllow, StageNetworkPolicy, e.Allow, inspect
			return d
		}
	}
	d.Verdict, d.Stage = VerdictDeny, StageNetworkPolicyDefaultDeny
	return d
}

func (d Decision) decided(stage Stage, m Match) Decision {
	d.Stage, d.Rule = stage, m.Rule
	switch m.Action {
	case ActionAccept:
		d.Verdict = VerdictAllow
	case ActionReject:
		d.Verdict = VerdictReject
	default:
		d.Verdict = VerdictDeny
	}
	return d
}

// bestOf is the match first in precedence among the entries.
func bestOf(found [3]*Entry, get func(*Entry) Match) Match {
	var best Match
	for _, e := range found {
		if e == nil {
			continue
		}
		if m := get(e); m.before(best) {
			best = m
		}
	}
	return best
}

// reachedLog is the first Log rule of tier t that comes before the tier's
// decision (or any, when nothing in the tier decided).
func reachedLog(found [3]*Entry, t Tier, decision Match) RuleID {
	log := bestOf(found, func(e *Entry) Match { return e.Log[t] })
	if log.Found() && (!decision.Found() || log.Rank < decision.Rank) {
		return log.Rule
	}
	return 0
}

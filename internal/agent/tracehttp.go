package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/policy"
)

// errTraceRequest marks an HTTP trace query that names no request the
// trace can send.
var errTraceRequest = errors.New("invalid HTTP trace request")

// traceRequestHead writes the request an HTTP trace judges as a client
// would send it, or says what is wrong with it.
func traceRequestHead(q *api.TraceRequest) ([]byte, error) {
	switch {
	case q.Method == "":
		return nil, fmt.Errorf("no method: give one, e.g. GET: %w", errTraceRequest)
	case q.Path == "":
		return nil, fmt.Errorf("no path: give one starting with /, e.g. /v1/status: %w", errTraceRequest)
	case strings.ContainsAny(q.Method+q.Path+q.Host, " \t\r\n"):
		return nil, fmt.Errorf("method %q, path %q, host %q: no whitespace allowed (escape it in the path as %%20): %w", q.Method, q.Path, q.Host, errTraceRequest)
	}
	host := q.Host
	if host == "" {
		host = "trace.invalid" // HTTP/1.1 needs one; rules with hostnames will not match it
	}
	var fields strings.Builder
	for _, h := range q.Headers {
		name, _, ok := strings.Cut(h, ":")
		switch {
		case !ok || strings.TrimSpace(name) != name || name == "":
			return nil, fmt.Errorf("header %q: want \"Name: value\": %w", h, errTraceRequest)
		case strings.ContainsAny(h, "\r\n"):
			return nil, fmt.Errorf("header %q: no line breaks allowed: %w", h, errTraceRequest)
		case strings.EqualFold(name, "host"):
			return nil, fmt.Errorf("header %q: give the Host with --host: %w", h, errTraceRequest)
		}
		fields.WriteString(h + "\r\n")
	}
	return []byte(q.Method + " " + q.Path + " HTTP/1.1\r\nHost: " + host + "\r\n" + fields.String() + "\r\n"), nil
}

// traceHTTP judges the traced request as pod's node does under pod's
// rules of direction dir (the server's ingress, the client's egress): the
// connection's decision, then its HTTP rules, and where the datapath
// judges it (in the kernel, or left to user space).
func traceHTTP(res *policy.Result, pod string, dir policy.Direction, peer netip.Addr, port uint16, q *api.TraceRequest) (*api.TraceHTTP, error) {
	head, err := traceRequestHead(q)
	if err != nil {
		return nil, err
	}
	out := &api.TraceHTTP{}
	reqs, perr := l7.NewParser(l7.Limits{}).Feed(head)
	var req *l7.Request
	probe := &l7.Request{Method: q.Method, Target: "/", Path: "/", Proto: "HTTP/1.1"}
	if len(reqs) == 1 {
		req, probe = reqs[0], reqs[0]
	}
	// A request the reader refuses is refused whatever the rules; the
	// connection's decision (from a probe) says whether it gets that far.
	d, err := res.LookupHTTP(pod, dir, peer, port, probe)
	out.Restricted = d.Restricted
	out.Rules = httpRulesOf(res, pod, dir, peer, port)
	switch {
	case !d.Conn.Allowed():
		out.Note = "the connection is " + d.Conn.Verdict.String() + " before any request is read"
		return out, nil
	case req == nil:
		out.Verdict = "refused"
		out.Rule = fmt.Sprintf("answered 400 before any rule: %v", perr)
		if !d.Restricted {
			out.Verdict, out.Rule = "allowed", "no HTTP rules restrict this connection: its requests are not read"
		}
		return out, nil
	case errors.Is(err, l7.ErrAmbiguousHeader):
		out.Verdict, out.Rule = "refused", "answered 400: a header a rule names appears twice"
		return out, nil
	case err != nil:
		return nil, err
	case !d.Restricted:
		out.Verdict, out.Rule = "allowed", "no HTTP rules restrict this connection: its requests are not read"
		return out, nil
	}
	out.Verdict, out.Rule = "denied", "answered 403: "
	if d.Allowed {
		out.Verdict, out.Rule = "allowed", ""
	}
	out.Rule += requestRule(res, d)
	out.Kernel = kernelPath(res, pod, dir, peer, port, req)
	return out, nil
}

// requestRule names what decided a judged request: the HTTP rule of a
// conditional cluster rule or of an allowing NetworkPolicy rule, a
// cluster rule without HTTP rules, or the stage that decided by default.
func requestRule(res *policy.Result, d policy.HTTPDecision) string {
	switch {
	case d.Rule == (policy.HTTPRuleRef{}):
	case res.HTTPTiers[d.Rule.Rule].Found():
		return fmt.Sprintf("%s http[%d] (%s)", traceRuleName(res, d.Rule.Rule), d.Rule.Index, describeHTTPRule(res.HTTPRules[d.Rule]))
	default:
		return fmt.Sprintf("%s ports[%d].http[%d] (%s)", traceRuleName(res, d.Rule.Rule), d.Rule.Port, d.Rule.Index,
			describeHTTPRule(res.HTTPRules[d.Rule]))
	}
	switch d.Request.Stage {
	case policy.StageAdmin, policy.StageBaseline:
		return traceRuleName(res, d.Request.Rule) + ", a rule without HTTP rules"
	case policy.StageNetworkPolicy:
		return traceRuleName(res, d.Request.Rule) + ", a rule without HTTP rules on the port"
	case policy.StageNetworkPolicyDefaultDeny:
		return "no HTTP rule of the connection matches"
	}
	return "no rule decides it, and the default allows"
}

// kernelPath says where the datapath judges a request of a restricted
// connection: in the kernel, or (conditional cluster rules, rules with
// regular expressions, heads the in-kernel reader does not hold) in user
// space. Egress has no
// user-space path: what the kernel cannot judge on a client's socket
// closes the connection.
func kernelPath(res *policy.Result, pod string, dir policy.Direction, peer netip.Addr, port uint16, req *l7.Request) string {
	userSpace := " (the connection is handed to the node's proxy, which judges it with every rule)"
	if dir == policy.Egress {
		userSpace = " (on the client's socket nothing judges it in user space yet: the connection is closed)"
	}
	if len(res.ConditionalRulesOf(pod, dir, peer, port)) > 0 {
		return "user space: cluster rules with HTTP rules decide in the precedence order, which the node's proxy walks for each request" + userSpace
	}
	if ok, why := l7.KernelReads(req); !ok {
		return "user space: the in-kernel reader does not hold " + why + userSpace
	}
	verdict := l7.KernelDeny
	for _, set := range res.HTTPSetsOf(pod, dir, peer, port) {
		rules := make([]l7.Rule, len(res.HTTPSets[set]))
		for i, ref := range res.HTTPSets[set] {
			rules[i] = res.HTTPRules[ref]
		}
		k, err := l7.CompileKernel(rules, l7.HashKey{}) // the verdict, not the hashes, matters here
		if err != nil {
			return "closed: " + err.Error()
		}
		switch k.Judge(req) {
		case l7.KernelRefuse:
			return "kernel: refused there (400)"
		case l7.KernelAllow:
			return "kernel: allowed there"
		case l7.KernelUserSpace:
			verdict = l7.KernelUserSpace
		}
	}
	if verdict == l7.KernelUserSpace {
		return "user space: only rules with conditions the kernel does not judge (regular expressions) may match" + userSpace
	}
	return "kernel: denied there"
}

// httpRulesOf lists the HTTP rules a connection is judged against:
// those of conditional cluster rules in precedence order, then those of
// the NetworkPolicy rules that allow it.
func httpRulesOf(res *policy.Result, pod string, dir policy.Direction, peer netip.Addr, port uint16) []string {
	var out []string
	for _, ref := range res.ConditionalRulesOf(pod, dir, peer, port) {
		t := res.HTTPTiers[ref.Rule]
		out = append(out, fmt.Sprintf("%s http[%d]: %s (%s the requests it matches)", traceRuleName(res, ref.Rule), ref.Index,
			describeHTTPRule(res.HTTPRules[ref]), strings.ToLower(t.Action.String())))
	}
	seen := map[policy.HTTPRuleRef]bool{}
	for _, set := range res.HTTPSetsOf(pod, dir, peer, port) {
		for _, ref := range res.HTTPSets[set] {
			if seen[ref] {
				continue
			}
			seen[ref] = true
			out = append(out, fmt.Sprintf("%s ports[%d].http[%d]: %s", traceRuleName(res, ref.Rule), ref.Port, ref.Index,
				describeHTTPRule(res.HTTPRules[ref])))
		}
	}
	return out
}

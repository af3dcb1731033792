package agent

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/policy"
)

// pipelinedNote says why a denial was not answered: the client sent it
// before the server answered the request before it.
const pipelinedNote = " (not answered: the server's answer to the request before it was still to come, and ours would have come first; the connection is closed)"

// StageHTTP is the Stage of a request's record: L7 policy judged it.
const StageHTTP = "http"

// maxRequestTexts bounds the requests remembered for the records that
// repeat them (one per open connection that is being read).
const maxRequestTexts = 65536

// httpFlows turns the kernel's request records (bpf/lib/l7events.h)
// into flow records. It remembers each connection's last recorded
// request, which the records of its repeats name by the connection's
// socket cookie alone. Used by one goroutine.
type httpFlows struct {
	node  string
	set   func(kernel uint32) (policy.HTTPSetID, bool)
	texts map[uint64]lastRequest
	// What records say of a rule or of a flow's sets, for the names
	// they were said with (saidWith): the same for every request, and
	// at one record a request, worth saying once.
	saidWith   *flowNames
	allowed    map[setRule]allowedText
	restricted map[[3]uint32]restrictedText
	// held are allowed requests' flows waiting, by connection, for the
	// next record of their connection, which carries the server's
	// answer when it came: then the request's flow says it (one flow a
	// request, as before answers were read). A flow held longer than
	// holdFor goes without (flushHeld); its answer, when it comes, is a
	// flow of its own.
	held map[uint64]heldFlow
}

// heldFlow is a request's flow waiting for its answer, since at.
type heldFlow struct {
	f  api.Flow
	at time.Time
}

// holdFor is how long a request's flow waits for its answer.
const holdFor = time.Second

// setRule names a rule of a kernel set.
type setRule struct {
	set  uint32
	rule int
}

// allowedText is what allowedBy says, restrictedText restrictedBy.
type allowedText struct {
	text string
	rule *api.FlowRule
	http *api.FlowHTTPRule
}

type restrictedText struct {
	text    string
	decider *api.FlowRule
}

// lastRequest is a connection's last recorded allowed request, which
// the records of its repeats and of the server's answers name, and the
// rule that allowed it.
type lastRequest struct {
	http api.FlowHTTP
	set  uint32
	rule int
}

func newHTTPFlows(node string, set func(uint32) (policy.HTTPSetID, bool)) *httpFlows {
	return &httpFlows{node: node, set: set, texts: map[uint64]lastRequest{}, held: map[uint64]heldFlow{}}
}

// sayWith starts over what was said when the names change (a policy
// or pod change): rules may have other names, sets other rules.
func (h *httpFlows) sayWith(names *flowNames) {
	if h.allowed == nil || h.saidWith != names {
		h.saidWith = names
		h.allowed = map[setRule]allowedText{}
		h.restricted = map[[3]uint32]restrictedText{}
	}
}

// flowsOf turns a record into the flows it completes: the connection's
// held request with the answer the record carries, or the server's
// answers as a flow of their own (named by the connection's last
// recorded request, so before this record's own request is
// remembered); then the record's own request, unless it is held for its
// answer.
func (h *httpFlows) flowsOf(names *flowNames, ev datapath.L7Event) []api.Flow {
	var out []api.Flow
	held, isHeld := h.held[ev.Cookie]
	delete(h.held, ev.Cookie)
	switch {
	case isHeld && ev.Replies == 1 && held.f.Count == 0:
		// Exactly its answer.
		out = append(out, withAnswer(held.f, ev))
	case ev.Replies > 0:
		if isHeld {
			out = append(out, held.f)
		}
		out = append(out, h.explainReplies(names, ev))
	case isHeld:
		out = append(out, held.f)
	}
	if ev.Verdict == datapath.L7Replied {
		return out
	}
	f := h.explain(names, ev)
	if ev.Proxied && ev.Verdict == datapath.L7Allowed && ev.Status != 0 {
		// Its own answer, which the proxy saw (HTTP/2).
		return append(out, withAnswer(f, ev))
	}
	if ev.Verdict == datapath.L7Allowed && !ev.Repeat && !ev.Closed && !ev.Proxied && ev.Count <= 1 {
		h.held[ev.Cookie] = heldFlow{f: f, at: time.Now()}
		return out
	}
	return append(out, f)
}

// withAnswer is a request's flow with the server's answer a record
// carries.
func withAnswer(f api.Flow, ev datapath.L7Event) api.Flow {
	req := *f.HTTP
	req.Status, req.Latency, req.LatencyMax = ev.Status, ev.Latency, ev.LatencyMax
	f.HTTP = &req
	return f
}

// flushHeld returns the flows held since before, without their
// answers, and forgets them; all of them when before is zero.
func (h *httpFlows) flushHeld(before time.Time) []api.Flow {
	var out []api.Flow
	for k, hf := range h.held {
		if before.IsZero() || hf.at.Before(before) {
			out = append(out, hf.f)
			delete(h.held, k)
		}
	}
	return out
}

// explain names a request record.
func (h *httpFlows) explain(names *flowNames, ev datapath.L7Event) api.Flow {
	f := h.flowOf(names, ev, ev.Count)
	req := h.request(ev)
	f.HTTP = &req
	switch {
	case ev.Policy != nil && ev.Verdict != datapath.L7Refused:
		h.explainTiers(names, ev, &f, &req)
	case ev.Verdict == datapath.L7Denied && ev.Handed:
		// Denied where the kernel cannot answer in place (too short
		// for a 403, or behind allowed bytes): the proxy judges it
		// again and answers, and its record is the one that counts.
		f.Verdict = "unjudged"
		_, f.Decider = h.restrictedBy(names, ev)
		f.Rule = "no HTTP rule allows it, and the kernel cannot answer it in place: handed to user space, which judges and answers it"
	case ev.Verdict == datapath.L7Allowed:
		f.Verdict = "allowed"
		f.Rule, f.Decider, req.Rule = h.allowedBy(names, ev)
	case ev.Verdict == datapath.L7Denied:
		f.Verdict = "denied"
		f.Rule, f.Decider = h.restrictedBy(names, ev)
		f.Rule = "no HTTP rule allows it: " + f.Rule
		switch {
		case ev.Answered:
			req.Status = 403
		case ev.Pipelined:
			f.Rule += pipelinedNote
		case ev.Egress:
			f.Rule += " (it followed allowed requests in one write, which cannot be answered apart: the write failed and the connection is closed)"
		default:
			f.Rule += " (the request was too short to answer in place: closed without an answer)"
		}
	case ev.Verdict == datapath.L7Refused:
		f.Verdict = "refused"
		req.Reason = ev.Reason()
		f.Rule = "refused before any rule: " + req.Reason
		if ev.Answered {
			req.Status = 400
		} else if ev.Pipelined {
			f.Rule += pipelinedNote
		}
	default: // punted, split
		f.Verdict = "unjudged"
		req.Reason = ev.Reason()
		if ev.Handed {
			f.Rule = "the kernel cannot judge it (" + req.Reason + "): handed to user space, which judges it"
		} else {
			f.Rule = "the kernel cannot judge it (" + req.Reason + "): the connection is closed"
		}
		_, f.Decider = h.restrictedBy(names, ev)
	}
	if ev.Proxied {
		f.Rule += " (judged in user space)"
	}
	req.Closed = ev.Closed
	return f
}

// explainTiers names what decided a request the proxy judged against
// the whole policy, walking the precedence order for it (a flow with
// conditional cluster rules): the tier rule, its HTTP rule, the Log rule
// passed on the way.
func (h *httpFlows) explainTiers(names *flowNames, ev datapath.L7Event, f *api.Flow, req *api.FlowHTTP) {
	d := ev.Policy
	var res *policy.Result
	if names != nil {
		res = names.policy
	}
	decided := d.Conn
	if d.Restricted {
		decided = d.Request
	}
	by := decided.Rule
	if d.Rule != (policy.HTTPRuleRef{}) {
		by = d.Rule.Rule
		match := ""
		if names != nil {
			match = describeHTTPRule(names.httpRules[d.Rule])
		}
		req.Rule = &api.FlowHTTPRule{Port: d.Rule.Port, Index: d.Rule.Index, Match: match}
	}
	f.Decider = names.flowRule(by)
	f.LoggedBy = names.flowRule(decided.Log)
	f.PassedBy = names.flowRule(decided.Passed)
	what := "no rule decides it, and the default allows"
	switch {
	case res != nil && d.Restricted:
		what = requestRule(res, *d)
	case !d.Restricted && d.Conn.Allowed():
		what = "no HTTP rule restricts this connection any more"
	case d.Conn.Rule != 0:
		what = ruleName(names, d.Conn.Rule) + ": the connection is no longer allowed"
	default:
		what = "the connection is no longer allowed (" + d.Conn.Stage.String() + ")"
	}
	// "by" a rule that decided; otherwise what decided, in words.
	sep := ": "
	if by != 0 && (d.Restricted || !d.Conn.Allowed()) {
		sep = " by "
	}
	if d.Allowed {
		f.Verdict = "allowed"
		f.Rule = "allowed" + sep + what
		return
	}
	f.Verdict = "denied"
	f.Rule = "denied" + sep + what
	switch {
	case ev.Answered:
		req.Status = 403
	case ev.Pipelined:
		f.Rule += pipelinedNote
	}
}

// flowOf is the flow of a record's connection, of n requests or answers,
// with the pods named; what it is about is the caller's to say.
func (h *httpFlows) flowOf(names *flowNames, ev datapath.L7Event, n uint32) api.Flow {
	// The local pod is the one whose rules judged the request: the
	// server for ingress, the client for egress.
	dir, pod, peer := policy.Ingress, ev.Server.Addr(), ev.Client.Addr()
	if ev.Egress {
		dir, pod, peer = policy.Egress, ev.Client.Addr(), ev.Server.Addr()
	}
	f := api.Flow{
		Time: ev.Time, Node: h.node, Direction: dir.String(), Stage: StageHTTP,
		Src: ev.Client.String(), Dst: ev.Server.String(), Proto: "TCP",
		Pod: pod.String(), Peer: peer.String(),
	}
	if n > 1 {
		f.Count = uint64(n)
		f.LastTime = ev.Time
	}
	if names != nil {
		if name, ok := names.byIP[pod]; ok {
			f.Pod = name
		}
		if name, ok := names.byIP[peer]; ok {
			f.Peer = name
		}
	}
	h.sayWith(names)
	return f
}

// explainReplies names the server's answers a record carries by the
// request they answer: the connection's last recorded one
// (bpf/lib/l7reply.h), with the rule that allowed it.
func (h *httpFlows) explainReplies(names *flowNames, ev datapath.L7Event) api.Flow {
	f := h.flowOf(names, ev, ev.Replies)
	req := api.FlowHTTP{Reply: true, Status: ev.Status, LatencyMax: ev.LatencyMax,
		Latency: ev.Latency / time.Duration(ev.Replies)}
	f.Verdict = "allowed"
	if last, ok := h.texts[ev.Cookie]; ok {
		req.Method, req.Host, req.Target, req.TargetCut = last.http.Method, last.http.Host, last.http.Target, last.http.TargetCut
		by := ev
		by.Set, by.Rule = last.set, last.rule
		f.Rule, f.Decider, req.Rule = h.allowedBy(names, by)
	} else {
		req.Reason = "answers requests recorded before this agent started"
		f.Rule = "the server's answers to requests recorded before this agent started"
	}
	f.HTTP = &req
	return f
}

// request is the request a record is about: its text, or for a repeat
// the connection's last recorded request's.
func (h *httpFlows) request(ev datapath.L7Event) api.FlowHTTP {
	if ev.Repeat {
		if last, ok := h.texts[ev.Cookie]; ok {
			return api.FlowHTTP{Method: last.http.Method, Host: last.http.Host, Target: last.http.Target, TargetCut: last.http.TargetCut}
		}
		return api.FlowHTTP{Reason: "repeats a request recorded before this agent started"}
	}
	// The Host's bytes are copied as they came: a refused head's may be
	// anything, so they are escaped like the line's.
	req := api.FlowHTTP{Host: printable([]byte(ev.Host))}
	req.Method, req.Target, req.TargetCut = requestLine(ev.Line, ev.LineCut)
	// The proxy's records come from another goroutine, in no set order
	// with the kernel's: the answers the kernel recorded of the request
	// before a hand-off are named by that request, never by the proxy's
	// (the kernel reads no answers after a hand-off).
	if ev.Proxied {
		return req
	}
	if ev.Verdict == datapath.L7Allowed && !ev.Closed {
		if len(h.texts) >= maxRequestTexts {
			h.forgetOne()
		}
		h.texts[ev.Cookie] = lastRequest{http: req, set: ev.Set, rule: ev.Rule}
	} else {
		delete(h.texts, ev.Cookie)
	}
	return req
}

// forgetOne drops a remembered request: the one a map iteration meets
// first, which starts at a random place, so a connection that went quiet
// is as likely as any to be it. One step, whatever the map's size: this
// runs for every new connection's record once the map is full.
func (h *httpFlows) forgetOne() {
	for k := range h.texts {
		delete(h.texts, k)
		return
	}
}

// requestLine reads the method and target from the first bytes of a
// head; cut says the head was longer than them, so a target that does
// not end in its space before the line's end was cut too.
func requestLine(line []byte, cut bool) (method, target string, targetCut bool) {
	end := bytes.Index(line, []byte("\r\n"))
	lineCut := end < 0 && cut
	if end < 0 {
		end = len(line)
	}
	m, rest, ok := bytes.Cut(line[:end], []byte(" "))
	if !ok {
		return printable(m), "", false
	}
	t, _, ended := bytes.Cut(rest, []byte(" "))
	return printable(m), printable(t), !ended && lineCut
}

// printable keeps a record's text to what a terminal shows as written:
// other bytes become their %XX escapes.
func printable(b []byte) string {
	if !slices.ContainsFunc(b, func(c byte) bool { return c <= ' ' || c >= 0x7f }) {
		return string(b)
	}
	var s strings.Builder
	for _, c := range b {
		if c > ' ' && c < 0x7f {
			s.WriteByte(c)
			continue
		}
		fmt.Fprintf(&s, "%%%02X", c)
	}
	return s.String()
}

// allowedBy names the rule that allowed a request.
func (h *httpFlows) allowedBy(names *flowNames, ev datapath.L7Event) (string, *api.FlowRule, *api.FlowHTTPRule) {
	k := setRule{ev.Set, ev.Rule}
	t, ok := h.allowed[k]
	if !ok {
		t.text, t.rule, t.http = h.sayAllowedBy(names, ev)
		h.allowed[k] = t
	}
	return t.text, t.rule, t.http
}

func (h *httpFlows) sayAllowedBy(names *flowNames, ev datapath.L7Event) (string, *api.FlowRule, *api.FlowHTTPRule) {
	if ev.Set == 0 {
		return "allowed: no policy restricts this connection to HTTP rules any more", nil, nil
	}
	ref, ok := h.ruleRef(names, ev.Set, ev.Rule)
	if !ok {
		return fmt.Sprintf("allowed by HTTP rule %d of set %d (no longer loaded)", ev.Rule, ev.Set), nil, nil
	}
	match := describeHTTPRule(names.httpRules[ref])
	return fmt.Sprintf("%s ports[%d].http[%d] (%s)", ruleName(names, ref.Rule), ref.Port, ref.Index, match),
		names.flowRule(ref.Rule), &api.FlowHTTPRule{Port: ref.Port, Index: ref.Index, Match: match}
}

// ruleRef finds rule i of a kernel set.
func (h *httpFlows) ruleRef(names *flowNames, kernel uint32, i int) (policy.HTTPRuleRef, bool) {
	id, ok := h.set(kernel)
	if !ok || names == nil {
		return policy.HTTPRuleRef{}, false
	}
	refs := names.httpSets[id]
	if i < 0 || i >= len(refs) {
		return policy.HTTPRuleRef{}, false
	}
	return refs[i], true
}

// restrictedBy names the policy rules whose HTTP rules a connection was
// judged against, and the first of them as the decider.
func (h *httpFlows) restrictedBy(names *flowNames, ev datapath.L7Event) (string, *api.FlowRule) {
	t, ok := h.restricted[ev.Sets]
	if !ok {
		t.text, t.decider = h.sayRestrictedBy(names, ev)
		h.restricted[ev.Sets] = t
	}
	return t.text, t.decider
}

func (h *httpFlows) sayRestrictedBy(names *flowNames, ev datapath.L7Event) (string, *api.FlowRule) {
	var (
		seen    = map[policy.RuleID]bool{}
		words   []string
		decider *api.FlowRule
	)
	for _, kernel := range ev.Sets {
		if kernel == 0 {
			continue
		}
		id, ok := h.set(kernel)
		if !ok || names == nil || names.httpSets[id] == nil {
			words = append(words, fmt.Sprintf("HTTP set %d (no longer loaded)", kernel))
			continue
		}
		for _, ref := range names.httpSets[id] {
			if seen[ref.Rule] {
				continue
			}
			seen[ref.Rule] = true
			words = append(words, ruleName(names, ref.Rule))
			if decider == nil {
				decider = names.flowRule(ref.Rule)
			}
		}
	}
	if len(words) == 0 {
		return "the connection is restricted to HTTP rules", nil
	}
	return strings.Join(words, ", "), decider
}

// describeHTTPRule writes a rule as a reader of the policy would.
func describeHTTPRule(r l7.Rule) string {
	var parts []string
	if r.Method != "" {
		parts = append(parts, r.Method)
	}
	if r.Path != nil {
		parts = append(parts, fmt.Sprintf("%s %s", r.Path.Type, r.Path.Value))
	}
	if len(r.Hostnames) > 0 {
		parts = append(parts, "host "+strings.Join(r.Hostnames, "|"))
	}
	for _, h := range r.Headers {
		parts = append(parts, fmt.Sprintf("header %s %s %q", h.Name, h.Type, h.Value))
	}
	if len(parts) == 0 {
		return "any request"
	}
	return strings.Join(parts, " ")
}

// readHTTPFlows turns the node's request records into flow records until
// ctx ends; a node without the L7 path has none.
func (a *Agent) readHTTPFlows(ctx context.Context, node *datapath.Node) error {
	if !node.L7Ready() {
		return nil
	}
	rd, err := node.OpenL7EventReader()
	if err != nil {
		return err
	}
	h := newHTTPFlows(a.cfg.NodeName, node.PolicyHTTPSet)
	// The kernel's records and the proxy's come from different
	// goroutines; h is one connection table for both.
	var mu sync.Mutex
	emit := func(f api.Flow) {
		a.metrics.countHTTP(f)
		a.flows.record(f)
		if a.flows.following.Load() > 0 {
			a.flows.send(f)
		}
	}
	record := func(ev datapath.L7Event) {
		mu.Lock()
		flows := h.flowsOf(a.flowNames.Load(), ev)
		mu.Unlock()
		for _, f := range flows {
			emit(f)
		}
	}
	if err := a.startL7Proxy(ctx, node, record); err != nil {
		// Not fatal: with no slot offered, the kernel closes (and
		// resets) what it would have handed over, as before the proxy.
		a.log.Warn("L7 proxy not running: connections the kernel cannot judge are closed", "err", err)
	}
	go readUntilClosed(ctx, a.log, "request record", rd.Read, rd.Close, record)
	// Requests whose answers did not come within holdFor go without.
	go func() {
		tick := time.NewTicker(holdFor / 2)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				mu.Lock()
				flows := h.flushHeld(now.Add(-holdFor))
				mu.Unlock()
				for _, f := range flows {
					emit(f)
				}
			}
		}
	}()
	return nil
}

// RequestRecorder is the agent's path for request records on its own:
// each record explained and counted into a flow store, as readHTTPFlows
// does (without policy names, which only add map lookups). For benches
// that price what recording every request costs.
type RequestRecorder struct {
	h   *httpFlows
	log *flowLog
}

// NewRequestRecorder records into a flow store in dir.
func NewRequestRecorder(dir string) (*RequestRecorder, error) {
	log, err := openFlowLog(Config{FlowDir: dir}, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	return &RequestRecorder{h: newHTTPFlows("bench", func(uint32) (policy.HTTPSetID, bool) { return 0, false }), log: log}, nil
}

// Record explains one record and counts it into the store.
func (r *RequestRecorder) Record(ev datapath.L7Event) {
	for _, f := range r.h.flowsOf(nil, ev) {
		r.log.record(f)
	}
}

// Close writes what the store holds in memory, the requests held for
// their answers too, and closes it.
func (r *RequestRecorder) Close() error {
	for _, f := range r.h.flushHeld(time.Time{}) {
		r.log.record(f)
	}
	return r.log.close()
}

package agent

import (
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/policy"
	"github.com/weirnet/weir/internal/proxy"
)

// deathstarNames are the names of a node whose deathstar pod a
// WeirNetworkPolicy restricts to two HTTP rules (compiled as set 3,
// written by the node as kernel set 103).
func deathstarNames() (*flowNames, func(uint32) (policy.HTTPSetID, bool)) {
	const rule policy.RuleID = 5
	landing := policy.HTTPRuleRef{Rule: rule, Port: 0, Index: 0}
	status := policy.HTTPRuleRef{Rule: rule, Port: 0, Index: 1}
	n := &flowNames{
		byIP: map[netip.Addr]string{
			netip.MustParseAddr("10.244.1.7"): "empire/deathstar-0",
			netip.MustParseAddr("10.244.2.9"): "empire/tiefighter",
		},
		rules: map[policy.RuleID]policy.RuleRef{rule: {Kind: policy.KindWeirNetworkPolicy, Namespace: "empire",
			Name: "deathstar", Direction: policy.Ingress, Index: 0}},
		httpSets: map[policy.HTTPSetID][]policy.HTTPRuleRef{3: {landing, status}},
		httpRules: map[policy.HTTPRuleRef]l7.Rule{
			landing: {Method: "POST", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/v1/request-landing"}},
			status:  {Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/v1/status"}},
		},
	}
	set := func(kernel uint32) (policy.HTTPSetID, bool) {
		if kernel <= 100 {
			return 0, false
		}
		return policy.HTTPSetID(kernel - 100), true
	}
	return n, set
}

func requestRecord(verdict datapath.L7Verdict, line string) datapath.L7Event {
	return datapath.L7Event{
		Time: time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC), Cookie: 42,
		Client: netip.MustParseAddrPort("10.244.2.9:40000"), Server: netip.MustParseAddrPort("10.244.1.7:80"),
		Sets: [3]uint32{103}, Count: 1, Verdict: verdict, Line: []byte(line), Host: "deathstar.empire",
	}
}

func TestHTTPRecordsNameTheRule(t *testing.T) {
	names, set := deathstarNames()
	h := newHTTPFlows("n1", set)

	ev := requestRecord(datapath.L7Allowed, "POST /v1/request-landing HTTP/1.1\r\nHost: deathstar.empire\r\n")
	ev.Set, ev.Rule = 103, 0
	f := h.explain(names, ev)
	if f.Verdict != "allowed" || f.Stage != StageHTTP || f.Pod != "empire/deathstar-0" || f.Peer != "empire/tiefighter" ||
		f.HTTP.Method != "POST" || f.HTTP.Target != "/v1/request-landing" || f.HTTP.Host != "deathstar.empire" || f.HTTP.Status != 0 {
		t.Fatalf("allowed record %+v %+v", f, f.HTTP)
	}
	if f.Decider == nil || f.Decider.Name != "deathstar" || f.HTTP.Rule == nil || f.HTTP.Rule.Index != 0 ||
		f.HTTP.Rule.Match != "POST Exact /v1/request-landing" ||
		f.Rule != "weirnetworkpolicy empire/deathstar ingress[0] ports[0].http[0] (POST Exact /v1/request-landing)" {
		t.Fatalf("allowed record names %q, %+v, %+v", f.Rule, f.Decider, f.HTTP.Rule)
	}

	// Its repeats carry no text: the connection's last request names them.
	rep := datapath.L7Event{Time: ev.Time.Add(time.Second), Cookie: 42, Client: ev.Client, Server: ev.Server, Sets: ev.Sets,
		Set: 103, Rule: 0, Count: 9, Verdict: datapath.L7Allowed, Repeat: true}
	f = h.explain(names, rep)
	if f.Count != 9 || f.HTTP.Method != "POST" || f.HTTP.Target != "/v1/request-landing" || f.HTTP.Rule == nil {
		t.Fatalf("repeat record %+v %+v", f, f.HTTP)
	}
	// Of a connection this agent never saw: said so.
	rep.Cookie = 7
	if f = h.explain(names, rep); f.HTTP.Method != "" || !strings.Contains(f.HTTP.Reason, "before this agent started") {
		t.Fatalf("repeat of an unknown connection %+v", f.HTTP)
	}

	ev = requestRecord(datapath.L7Denied, "PUT /v1/exhaust-port HTTP/1.1\r\nHost: deathstar.empire\r\n")
	ev.Answered, ev.Closed = true, true
	f = h.explain(names, ev)
	if f.Verdict != "denied" || f.HTTP.Status != 403 || !f.HTTP.Closed || f.Decider == nil || f.Decider.Name != "deathstar" ||
		f.Rule != "no HTTP rule allows it: weirnetworkpolicy empire/deathstar ingress[0]" {
		t.Fatalf("denied record %q %+v %+v", f.Rule, f, f.HTTP)
	}
	if _, ok := h.texts[42]; ok {
		t.Fatal("a closed connection's request is still remembered")
	}

	ev = requestRecord(datapath.L7Refused, "GET /a/../b HTTP/1.1\r\n")
	ev.Answered, ev.Error = true, 5 // HTTP_ERR_PATH
	if f = h.explain(names, ev); f.Verdict != "refused" || f.HTTP.Status != 400 || !strings.Contains(f.HTTP.Reason, "dot segment") {
		t.Fatalf("refused record %q %+v", f.Rule, f.HTTP)
	}
	// A refused head's Host may hold anything: escaped, never a
	// terminal's control sequence.
	ev.Host = "a\x1b[2Jb"
	if f = h.explain(names, ev); f.HTTP.Host != "a%1B[2Jb" {
		t.Fatalf("host %q, want its control byte escaped", f.HTTP.Host)
	}

	// A set an earlier agent wrote, or one gone since: named as such.
	ev = requestRecord(datapath.L7Allowed, "GET /v1/status HTTP/1.1\r\n")
	ev.Set, ev.Sets = 99, [3]uint32{99}
	if f = h.explain(names, ev); f.Decider != nil || !strings.Contains(f.Rule, "no longer loaded") {
		t.Fatalf("record of an old set: %q %+v", f.Rule, f.Decider)
	}
	// No restriction any more.
	ev.Set = 0
	if f = h.explain(names, ev); !strings.Contains(f.Rule, "no policy restricts") {
		t.Fatalf("unrestricted record: %q", f.Rule)
	}
}

func TestRequestLine(t *testing.T) {
	for _, c := range []struct {
		line           string
		cut            bool
		method, target string
		targetCut      bool
	}{
		{"GET /a?b=c HTTP/1.1\r\nHost: x\r\n", false, "GET", "/a?b=c", false},
		{"GET /" + strings.Repeat("a", 200), true, "GET", "/" + strings.Repeat("a", 200), true},
		{"GET /a HTTP/1.1", true, "GET", "/a", false},
		{"G\x01T /\xff HTTP/1.1\r\n", false, "G%01T", "/%FF", false},
		{"", false, "", "", false},
	} {
		m, tg, cut := requestLine([]byte(c.line), c.cut)
		if m != c.method || tg != c.target || cut != c.targetCut {
			t.Errorf("requestLine(%q, %v) = %q, %q, %v; want %q, %q, %v", c.line, c.cut, m, tg, cut, c.method, c.target, c.targetCut)
		}
	}
}

func TestHTTPFiltersSelectRequests(t *testing.T) {
	conn := api.Flow{Verdict: "allowed"}
	req := func(method, target string, status int) api.Flow {
		return api.Flow{Verdict: "denied", HTTP: &api.FlowHTTP{Method: method, Target: target, Status: status}}
	}
	for _, c := range []struct {
		filter api.FlowFilter
		flow   api.Flow
		want   bool
	}{
		{api.FlowFilter{}, conn, true},
		{api.FlowFilter{HTTP: true}, conn, false},
		{api.FlowFilter{HTTP: true}, req("GET", "/", 0), true},
		{api.FlowFilter{Method: "PUT"}, req("PUT", "/x", 403), true},
		{api.FlowFilter{Method: "PUT"}, req("GET", "/x", 403), false},
		{api.FlowFilter{Path: "/v1"}, req("GET", "/v1/status?x=1", 0), true},
		{api.FlowFilter{Path: "/v1"}, req("GET", "/v1", 0), true},
		{api.FlowFilter{Path: "/v1"}, req("GET", "/v10", 0), false},
		{api.FlowFilter{Path: "/"}, req("GET", "/anything", 0), true},
		{api.FlowFilter{Status: 403}, req("PUT", "/x", 403), true},
		{api.FlowFilter{Status: 403}, req("PUT", "/x", 0), false},
		{api.FlowFilter{Status: 403}, conn, false},
	} {
		if got := c.filter.Matcher()(c.flow); got != c.want {
			t.Errorf("filter %+v on %+v: %v, want %v", c.filter, c.flow.HTTP, got, c.want)
		}
	}
}

// BenchmarkRecordNewPaths prices the agent's path for a request record
// (explained with names, counted, stored) when every request is a path
// of its own, as bench l7-gate's new-paths setup sends: one record each,
// over 100 keep-alive connections.
func BenchmarkRecordNewPaths(b *testing.B) {
	const connections = 100
	names, set := deathstarNames()
	h := newHTTPFlows("n1", set)
	log, err := openFlowLog(Config{FlowDir: b.TempDir()}, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	defer log.close()
	m := newMetrics(nil, log, slog.New(slog.DiscardHandler))
	lines := make([][]byte, 4096)
	for i := range lines {
		lines[i] = []byte(fmt.Sprintf("GET /v1/status/%d HTTP/1.1\r\nHost: deathstar.empire\r\n", i))
	}
	ev := requestRecord(datapath.L7Allowed, "")
	ev.Set, ev.Rule = 103, 1
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ev.Line = lines[i%len(lines)]
		ev.Cookie = uint64(i % connections)
		f := h.explain(names, ev)
		m.countHTTP(f)
		log.record(f)
	}
}

// TestHTTPRecordsFollowRenames: what records say of a rule is said once
// per set of names, and anew when the names change (a policy renamed, a
// set's rules reordered).
func TestHTTPRecordsFollowRenames(t *testing.T) {
	names, set := deathstarNames()
	h := newHTTPFlows("n1", set)
	ev := requestRecord(datapath.L7Allowed, "POST /v1/request-landing HTTP/1.1\r\n")
	ev.Set, ev.Rule = 103, 0
	if f := h.explain(names, ev); !strings.Contains(f.Rule, "empire/deathstar ingress[0]") {
		t.Fatalf("first record: %q", f.Rule)
	}
	denied := requestRecord(datapath.L7Denied, "PUT /x HTTP/1.1\r\n")
	if f := h.explain(names, denied); !strings.Contains(f.Rule, "empire/deathstar ingress[0]") {
		t.Fatalf("first denial: %q", f.Rule)
	}
	renamed, _ := deathstarNames()
	ref := renamed.rules[5]
	ref.Name = "deathstar-v2"
	renamed.rules[5] = ref
	if f := h.explain(renamed, ev); !strings.Contains(f.Rule, "empire/deathstar-v2 ingress[0]") || f.Decider.Name != "deathstar-v2" {
		t.Fatalf("after the rename: %q, %+v", f.Rule, f.Decider)
	}
	if f := h.explain(renamed, denied); !strings.Contains(f.Rule, "empire/deathstar-v2 ingress[0]") {
		t.Fatalf("denial after the rename: %q", f.Rule)
	}
}

// BenchmarkRecordNewConnections prices a record when every request is a
// connection of its own that stays open, once the remembered requests
// are at their bound: forgetting one must not cost the map's size.
func BenchmarkRecordNewConnections(b *testing.B) {
	names, set := deathstarNames()
	h := newHTTPFlows("n1", set)
	ev := requestRecord(datapath.L7Allowed, "GET /v1/status/x HTTP/1.1\r\nHost: deathstar.empire\r\n")
	ev.Set, ev.Rule = 103, 1
	for i := 0; i < maxRequestTexts; i++ {
		ev.Cookie = uint64(i)
		h.explain(names, ev)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ev.Cookie = uint64(maxRequestTexts + i)
		h.explain(names, ev)
	}
	if len(h.texts) > maxRequestTexts {
		b.Fatalf("%d requests remembered, bound %d", len(h.texts), maxRequestTexts)
	}
}

// TestProxyRecordsSayUserSpace: the proxy's records of requests it judged
// in user space name the rule as the kernel's do, and say where they
// were judged; the kernel's record of the hand-off says it handed the
// connection over.
func TestProxyRecordsSayUserSpace(t *testing.T) {
	names, set := deathstarNames()
	h := newHTTPFlows("n1", set)
	p := l7.NewParser(l7.Limits{})
	reqs, err := p.Feed([]byte("POST /v1/request-landing HTTP/1.1\r\nHost: deathstar.empire\r\nConnection: close\r\n\r\n"))
	if err != nil || len(reqs) != 1 {
		t.Fatal(reqs, err)
	}
	handoff := datapath.Handoff{Active: true, Cookie: 42, Server: netip.MustParseAddrPort("10.244.1.7:80"),
		Client: netip.MustParseAddrPort("10.244.2.9:40000"), Sets: [3]uint32{103}}
	f := h.explain(names, proxyEvent(proxy.Record{Handoff: handoff, Sets: handoff.Sets, Request: reqs[0], Decision: proxy.Decision{Verdict: proxy.Allow, Set: 103, Rule: 0}}))
	if f.Verdict != "allowed" || f.Pod != "empire/deathstar-0" || f.HTTP.Method != "POST" || f.HTTP.Target != "/v1/request-landing" ||
		f.Rule != "weirnetworkpolicy empire/deathstar ingress[0] ports[0].http[0] (POST Exact /v1/request-landing) (judged in user space)" {
		t.Fatalf("the proxy's allowed record: %q %+v %+v", f.Rule, f, f.HTTP)
	}
	f = h.explain(names, proxyEvent(proxy.Record{Handoff: handoff, Sets: handoff.Sets, Request: reqs[0], Decision: proxy.Decision{Verdict: proxy.Deny}, Answered: true}))
	if f.Verdict != "denied" || f.HTTP.Status != 403 || !strings.HasSuffix(f.Rule, "(judged in user space)") {
		t.Fatalf("the proxy's denied record: %q %+v", f.Rule, f.HTTP)
	}
	// An HTTP/2 request the proxy judged and whose answer it carried:
	// one flow, with the server's status and the time to its head.
	h2, rerr := l7.HTTP2Request("POST", "/v1/request-landing", "deathstar.empire", nil, nil)
	if rerr != nil {
		t.Fatal(rerr)
	}
	flows := h.flowsOf(names, proxyEvent(proxy.Record{Handoff: handoff, Sets: handoff.Sets, Request: h2,
		Decision: proxy.Decision{Verdict: proxy.Allow, Set: 103, Rule: 0}, Status: 201, Latency: 3 * time.Millisecond}))
	if len(flows) != 1 || flows[0].Verdict != "allowed" || flows[0].HTTP.Status != 201 || flows[0].HTTP.Latency != 3*time.Millisecond ||
		flows[0].HTTP.Target != "/v1/request-landing" || flows[0].HTTP.Method != "POST" {
		t.Fatalf("the proxy's HTTP/2 record: %+v", flows)
	}
	ev := requestRecord(datapath.L7Split, "POST /v1/req")
	ev.Handed = true
	if f = h.explain(names, ev); f.Verdict != "unjudged" || !strings.Contains(f.Rule, "handed to user space") {
		t.Fatalf("the kernel's record of a hand-off: %q", f.Rule)
	}
	// A denial the kernel hands over to be answered is counted once:
	// the proxy's record says denied, the kernel's does not.
	ev = requestRecord(datapath.L7Denied, "PUT /x")
	ev.Handed = true
	if f = h.explain(names, ev); f.Verdict != "unjudged" || f.HTTP.Status != 0 || !strings.Contains(f.Rule, "handed to user space, which judges and answers it") {
		t.Fatalf("the kernel's record of a denial handed over: %q %+v", f.Rule, f)
	}
}

// TestHTTPAnswersJoinTheirRequests: an allowed request's flow waits for
// the next record of its connection; when that carries exactly its
// answer, the request's flow says the server's status and latency (one
// flow a request). Answers to several requests (a run of repeats), or
// after the request's flow went without (a second passed, or the
// proxy's record came between), are a flow of their own named by the
// request and its rule. Answers count as answers, requests as requests.
func TestHTTPAnswersJoinTheirRequests(t *testing.T) {
	names, set := deathstarNames()
	h := newHTTPFlows("n1", set)
	status := requestRecord(datapath.L7Allowed, "GET /v1/status/ok HTTP/1.1\r\nHost: deathstar.empire\r\n")
	status.Set, status.Rule = 103, 1
	landing := requestRecord(datapath.L7Allowed, "POST /v1/request-landing HTTP/1.1\r\nHost: deathstar.empire\r\n")
	landing.Set, landing.Rule = 103, 0
	answers := func(ev datapath.L7Event, n uint32, code int, sum, longest time.Duration) datapath.L7Event {
		ev.Replies, ev.Status, ev.Latency, ev.LatencyMax = n, code, sum, longest
		return ev
	}
	alone := datapath.L7Event{Time: status.Time.Add(time.Second), Cookie: 42, Client: status.Client, Server: status.Server,
		Sets: status.Sets, Verdict: datapath.L7Replied}

	if flows := h.flowsOf(names, status); len(flows) != 0 {
		t.Fatalf("an allowed request's flow did not wait for its answer: %+v", flows)
	}
	// The landing's record carries the status request's answer.
	flows := h.flowsOf(names, answers(landing, 1, 503, 2*time.Millisecond, 2*time.Millisecond))
	if len(flows) != 1 || flows[0].HTTP.Target != "/v1/status/ok" || flows[0].HTTP.Status != 503 || flows[0].HTTP.Reply ||
		flows[0].HTTP.Latency != 2*time.Millisecond || flows[0].HTTP.Rule == nil || flows[0].HTTP.Rule.Index != 1 {
		t.Fatalf("the status request with its answer: %+v", flows)
	}
	withAnswer := flows[0]
	// The connection closes: a record of the landing's answer alone.
	flows = h.flowsOf(names, answers(alone, 1, 200, time.Millisecond, time.Millisecond))
	if len(flows) != 1 || flows[0].HTTP.Target != "/v1/request-landing" || flows[0].HTTP.Status != 200 || flows[0].HTTP.Reply {
		t.Fatalf("the landing with its answer: %+v", flows)
	}

	// Repeats: the first request's flow goes when the repeats' record
	// comes, and the answers to all four are a flow of their own.
	h.flowsOf(names, status)
	rep := status
	rep.Repeat, rep.Count, rep.Line, rep.Host = true, 3, nil, ""
	flows = h.flowsOf(names, rep)
	if len(flows) != 2 || flows[0].HTTP.Status != 0 || flows[1].Count != 3 {
		t.Fatalf("a request and its repeats: %+v", flows)
	}
	flows = h.flowsOf(names, answers(landing, 4, 200, 8*time.Millisecond, 5*time.Millisecond))
	if len(flows) != 1 {
		t.Fatalf("answers to four requests, then a held landing: %+v", flows)
	}
	f := flows[0]
	if !f.HTTP.Reply || f.Count != 4 || f.HTTP.Status != 200 || f.HTTP.Latency != 2*time.Millisecond || f.HTTP.LatencyMax != 5*time.Millisecond ||
		f.HTTP.Method != "GET" || f.HTTP.Target != "/v1/status/ok" || f.Verdict != "allowed" || f.Decider == nil || f.Decider.Name != "deathstar" ||
		f.HTTP.Rule == nil || f.HTTP.Rule.Index != 1 {
		t.Fatalf("answers' flow %+v %+v", f, f.HTTP)
	}

	// A second without a record: the landing goes without its answer,
	// which comes later as a flow of its own.
	if got := h.flushHeld(time.Now().Add(time.Hour)); len(got) != 1 || got[0].HTTP.Target != "/v1/request-landing" || got[0].HTTP.Status != 0 {
		t.Fatalf("flushed %+v, want the landing without an answer", got)
	}
	flows = h.flowsOf(names, answers(alone, 1, 200, time.Millisecond, time.Millisecond))
	if len(flows) != 1 || !flows[0].HTTP.Reply || flows[0].HTTP.Target != "/v1/request-landing" {
		t.Fatalf("a late answer: %+v", flows)
	}

	// The proxy's record of a later request (after a hand-off) lets the
	// held flow go, and does not become what answers are named by.
	h.flowsOf(names, status)
	proxied := requestRecord(datapath.L7Allowed, "GET /v1/status/other HTTP/1.1\r\n")
	proxied.Set, proxied.Rule, proxied.Proxied = 103, 1, true
	if flows = h.flowsOf(names, proxied); len(flows) != 2 || flows[0].HTTP.Target != "/v1/status/ok" {
		t.Fatalf("the proxy's record: %+v", flows)
	}
	if flows = h.flowsOf(names, answers(alone, 1, 200, time.Millisecond, time.Millisecond)); flows[0].HTTP.Target != "/v1/status/ok" {
		t.Fatalf("answers after the proxy's record named %q", flows[0].HTTP.Target)
	}

	m, _ := newTestMetrics(t, &metricsDatapath{})
	m.countHTTP(withAnswer)
	m.countHTTP(f)
	count := func(v *prometheus.CounterVec, labels ...string) float64 {
		return promtest.ToFloat64(v.WithLabelValues(labels...))
	}
	if n := count(m.httpReplies, "503", "WeirNetworkPolicy", "empire", "deathstar"); n != 1 {
		t.Errorf("503 answers: %v, want 1", n)
	}
	if n := count(m.httpReplies, "200", "WeirNetworkPolicy", "empire", "deathstar"); n != 4 {
		t.Errorf("200 answers: %v, want 4", n)
	}
	if s := count(m.httpReplySeconds, "200", "WeirNetworkPolicy", "empire", "deathstar"); s < 0.0079 || s > 0.0081 {
		t.Errorf("200 answers' seconds: %v, want 0.008", s)
	}
	if n := count(m.httpRequests, "allowed", "", "WeirNetworkPolicy", "empire", "deathstar"); n != 1 || promtest.CollectAndCount(m.httpRequests) != 1 {
		t.Errorf("requests: %v allowed in %d series, want the one request alone", n, promtest.CollectAndCount(m.httpRequests))
	}

	// Answers on a connection this agent never saw a request of.
	alone.Cookie = 7
	if f = h.flowsOf(names, answers(alone, 1, 200, 1, 1))[0]; !f.HTTP.Reply || f.HTTP.Method != "" || !strings.Contains(f.HTTP.Reason, "before this agent started") {
		t.Fatalf("answers of an unknown connection %+v", f.HTTP)
	}
}

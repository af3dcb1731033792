package proxy

import (
	"strings"
	"testing"

	"github.com/weirnet/weir/internal/l7"
)

// testJudge allows what set 1's rules allow.
func testJudge(t *testing.T) *SetJudge {
	t.Helper()
	m, err := l7.Compile([]l7.Rule{
		{Method: "GET", Path: &l7.PathMatch{Type: l7.PathRegularExpression, Value: "/items/[0-9]+"}},
		{Method: "POST", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/public"},
			Headers: []l7.HeaderMatch{{Type: l7.HeaderPresent, Name: "X-Trace"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var sets Matchers
	sets.Put(1, m)
	return NewSetJudge(sets.Get)
}

// outcome is what a stream did with its input: the bytes forwarded, and
// the answers and ends in order, as text.
func outcome(steps []step) (forwarded string, acts []string) {
	var b strings.Builder
	for _, s := range steps {
		switch s.kind {
		case stepForward:
			b.Write(s.data)
		case stepAnswer:
			acts = append(acts, map[int]string{403: "403", 400: "400"}[s.status])
		case stepEnd:
			acts = append(acts, "end")
		}
	}
	return b.String(), acts
}

// feedAll feeds in pieces of size n (0: whole).
func feedAll(s *stream, in string, n int) ([]step, []judged) {
	if n == 0 {
		return s.feed([]byte(in))
	}
	var steps []step
	var js []judged
	for i := 0; i < len(in); i += n {
		st, j := s.feed([]byte(in[i:min(i+n, len(in))]))
		steps = append(steps, st...)
		js = append(js, j...)
	}
	return steps, js
}

const (
	getItem   = "GET /items/7 HTTP/1.1\r\nHost: h\r\n\r\n"
	getSecret = "GET /secret HTTP/1.1\r\nHost: h\r\n\r\n"
	postOK    = "POST /public/x HTTP/1.1\r\nHost: h\r\nX-Trace: 1\r\nContent-Length: 5\r\n\r\nhello"
	postNoTr  = "POST /public/x HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
	chunked   = "POST /public/c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
)

// TestStreamDecides: what reaches the server, and what is answered, for
// streams handed over at a head, read whole and cut at every byte: the
// result does not depend on where the stream was cut.
func TestStreamDecides(t *testing.T) {
	for _, tc := range []struct {
		name, prefix, in string
		forwarded        string
		acts             []string
	}{
		{"allowed", "", getItem + postOK, getItem + postOK, nil},
		{"the prefix goes unread", "body-tail", getItem, "body-tail" + getItem, nil},
		{"denied, then allowed: keep-alive", "", getSecret + getItem, getItem, []string{"403"}},
		{"a denied request's body is skipped", "", postNoTr + getItem, getItem, []string{"403"}},
		{"a denied chunked body is skipped", "", strings.Replace(chunked, "POST /public/c", "POST /private", 1) + getItem, getItem, []string{"403"}},
		{"an allowed chunked body goes", "", strings.Replace(chunked, "\r\n\r\n5", "\r\nX-Trace: 1\r\n\r\n5", 1) + getItem,
			strings.Replace(chunked, "\r\n\r\n5", "\r\nX-Trace: 1\r\n\r\n5", 1) + getItem, nil},
		{"a refused stream: what came before goes", "", getItem + "GET /items/../x HTTP/1.1\r\nHost: h\r\n\r\n" + getItem, getItem, []string{"400", "end"}},
		{"a header a rule names, twice", "", "POST /public/x HTTP/1.1\r\nHost: h\r\nX-Trace: 1\r\nX-Trace: 2\r\n\r\n", "", []string{"400", "end"}},
		{"smuggling: length and chunked", "", "POST /public/x HTTP/1.1\r\nHost: h\r\nX-Trace: 1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + getSecret, "", []string{"400", "end"}},
		{"an allowed upgrade ends it", "", "GET /items/1 HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n" + getSecret, "", []string{"end"}},
		{"a partial head is held", "", getItem + "GET /items/8 HTTP/1.1\r\nHo", getItem, nil},
		{"a denied request that asks to close", "", strings.Replace(getSecret, "Host: h", "Host: h\r\nConnection: close", 1) + getItem, "", []string{"403", "end"}},
	} {
		for _, n := range []int{0, 1, 3, 7} {
			s := newStream(testJudge(t), Conn{Sets: [3]uint32{1}}, uint32(len(tc.prefix)))
			steps, _ := feedAll(s, tc.prefix+tc.in, n)
			fwd, acts := outcome(steps)
			if fwd != tc.forwarded || strings.Join(acts, ",") != strings.Join(tc.acts, ",") {
				t.Errorf("%s, in pieces of %d: forwarded %q, did %v; want %q, %v", tc.name, n, fwd, acts, tc.forwarded, tc.acts)
			}
		}
	}
}

// TestStreamAnswersInTurn: an answer carries where its request's head
// ended and where the last allowed one's did, for the proxy's check that
// the server has answered before it; the hand-off's own head is the
// first.
func TestStreamAnswersInTurn(t *testing.T) {
	s := newStream(testJudge(t), Conn{Sets: [3]uint32{1}}, 0)
	steps, judged := s.feed([]byte(getItem + getSecret))
	if len(judged) != 2 || judged[0].decision.Verdict != Allow || judged[1].decision.Verdict != Deny {
		t.Fatalf("judged %+v", judged)
	}
	var ans *step
	for i := range steps {
		if steps[i].kind == stepAnswer {
			ans = &steps[i]
		}
	}
	if ans == nil || ans.lastAllowedAt != int64(len(getItem)-1) || ans.at != int64(len(getItem)+len(getSecret)-1) {
		t.Fatalf("answer step %+v, want at %d after the allowed one at %d", ans, len(getItem)+len(getSecret)-1, len(getItem)-1)
	}
	s = newStream(testJudge(t), Conn{Sets: [3]uint32{1}}, 0)
	steps, _ = s.feed([]byte(getSecret))
	if len(steps) != 1 || steps[0].lastAllowedAt != -1 {
		t.Fatalf("a denial first after the hand-off: %+v, want no allowed request before it", steps)
	}
}

// TestSetJudgeReadsSetsInOrder: the user-space judge decides as the
// kernel's l7_judge_sets: no sets allow all, the first allowing set
// names the rule, an unknown set allows nothing.
func TestSetJudgeReadsSetsInOrder(t *testing.T) {
	j := testJudge(t)
	p := l7.NewParser(l7.Limits{})
	reqs, err := p.Feed([]byte(getItem))
	if err != nil || len(reqs) != 1 {
		t.Fatal(reqs, err)
	}
	r := reqs[0]
	for _, tc := range []struct {
		sets [3]uint32
		want Decision
	}{
		{[3]uint32{}, Decision{Verdict: Allow}},
		{[3]uint32{1}, Decision{Verdict: Allow, Set: 1, Rule: 0}},
		{[3]uint32{9, 1}, Decision{Verdict: Allow, Set: 1, Rule: 0}},
		{[3]uint32{9}, Decision{Verdict: Deny}},
	} {
		if got := j.Judge(Conn{Sets: tc.sets}, r); got != tc.want {
			t.Errorf("sets %v: %+v, want %+v", tc.sets, got, tc.want)
		}
	}
	j = NewSetJudge(func(uint32) *l7.Matcher { return nil })
	if got := j.Judge(Conn{Sets: [3]uint32{1}}, r); got.Verdict != Deny {
		t.Errorf("a set with no matcher: %+v, want denied", got)
	}
}

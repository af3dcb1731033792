package datapath

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirnet/weir/internal/l7"
)

// recordCollector gathers a reader's request records as they come, and
// apart from them the answers each record carries (as a record of
// answers alone: Verdict L7Replied, Count the answers).
type recordCollector struct {
	ch, replies chan L7Event
	read        atomic.Int64 // records read, of answers alone too
}

func collectRecords(t *testing.T, rd *L7EventReader) *recordCollector {
	t.Helper()
	c := &recordCollector{ch: make(chan L7Event, 1024), replies: make(chan L7Event, 4096)}
	go func() {
		for {
			ev, err := rd.Read()
			if err != nil {
				close(c.ch)
				close(c.replies)
				return
			}
			c.read.Add(1)
			if ev.Replies > 0 {
				reply := ev
				reply.Verdict, reply.Count, reply.Line, reply.Host = L7Replied, ev.Replies, nil, ""
				select {
				case c.replies <- reply:
				default: // a test that reads no answers' records
				}
			}
			if ev.Verdict != L7Replied {
				c.ch <- ev
			}
		}
	}()
	t.Cleanup(func() { rd.Close() })
	return c
}

// take returns the next n request records, failing after a few seconds.
func (c *recordCollector) take(t *testing.T, n int) []L7Event {
	t.Helper()
	return takeFrom(t, c.ch, n)
}

// takeReplies returns the next n records of answers.
func (c *recordCollector) takeReplies(t *testing.T, n int) []L7Event {
	t.Helper()
	return takeFrom(t, c.replies, n)
}

func takeFrom(t *testing.T, ch chan L7Event, n int) []L7Event {
	t.Helper()
	var out []L7Event
	deadline := time.After(5 * time.Second)
	for len(out) < n {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("reader closed after %d of %d records: %+v", len(out), n, out)
			}
			out = append(out, ev)
		case <-deadline:
			t.Fatalf("%d of %d records after 5 s: %+v", len(out), n, out)
		}
	}
	return out
}

// none fails if a record comes within a moment.
func (c *recordCollector) none(t *testing.T) {
	t.Helper()
	select {
	case ev := <-c.ch:
		t.Fatalf("unexpected record %+v (line %q)", ev, ev.Line)
	case <-time.After(300 * time.Millisecond):
	}
}

// TestL7RequestRecords: every request the HTTP verdict judges is in a
// record, with real sockets: its request line and Host as sent, the rule
// that allowed it; requests repeating the last one on their connection
// are counted into one record when another request comes or the socket
// closes, and start a new run after a second; denials and refusals are
// recorded before the answer overwrites them.
func TestL7RequestRecords(t *testing.T) {
	s, cg := attachL7ForTest(t)
	rd, err := s.OpenEventReader()
	if err != nil {
		t.Fatal(err)
	}
	recs := collectRecords(t, rd)
	const port = 18620
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	rules := []l7.Rule{
		{Method: "POST", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/v1/request-landing"}},
		{Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/public"}},
	}
	serveHTTPRules(t, s, cg, addr, port, 7, rules)

	get := "GET /public/a?x=1 HTTP/1.1\r\nUser-Agent: weir-test\r\nHost: Deathstar.Empire:80\r\n\r\n"
	land := "POST /v1/request-landing HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 4\r\n\r\nland"
	exhaust := "PUT /v1/exhaust-port HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 4\r\n\r\nboom"
	got := rawExchange(t, addr, get, get, get, get, get, land, exhaust)
	if strings.Count(got, "200 OK") != 6 || !strings.Contains(got, "HTTP/1.1 403 ") {
		t.Fatalf("got %q, want six 200s and a 403", got)
	}
	evs := recs.take(t, 4)
	first, repeats, landed, denied := evs[0], evs[1], evs[2], evs[3]
	for _, ev := range evs {
		if ev.Cookie != first.Cookie || ev.Server.Port() != port || ev.Client.Addr().String() != "127.0.0.1" || ev.Sets != [3]uint32{7} {
			t.Fatalf("record %+v: want one connection to port %d judged against set 7", ev, port)
		}
	}
	if first.Verdict != L7Allowed || first.Repeat || first.Count != 1 || first.Set != 7 || first.Rule != 1 ||
		!strings.HasPrefix(string(first.Line), "GET /public/a?x=1 HTTP/1.1\r\n") || first.Host != "Deathstar.Empire" {
		t.Fatalf("first record %+v (line %q), want GET /public/a allowed by rule 1 with its host", first, first.Line)
	}
	if repeats.Verdict != L7Allowed || !repeats.Repeat || repeats.Count != 4 || repeats.Rule != 1 || len(repeats.Line) != 0 {
		t.Fatalf("repeats %+v, want 4 repeats of rule 1 without text", repeats)
	}
	if landed.Verdict != L7Allowed || landed.Rule != 0 || !strings.HasPrefix(string(landed.Line), "POST /v1/request-landing ") {
		t.Fatalf("landing %+v (line %q), want allowed by rule 0", landed, landed.Line)
	}
	if denied.Verdict != L7Denied || !denied.Answered || !denied.Closed || denied.Set != 0 ||
		!strings.HasPrefix(string(denied.Line), "PUT /v1/exhaust-port HTTP/1.1\r\n") || denied.Host != "deathstar" {
		t.Fatalf("denial %+v (line %q), want PUT /v1/exhaust-port denied, answered, closed", denied, denied.Line)
	}
	recs.none(t) // the landing had no repeats to record at close

	// Repeats are recorded when the socket closes.
	rawExchange(t, addr, get, get, get)
	evs = recs.take(t, 2)
	if evs[0].Repeat || evs[0].Count != 1 || !evs[1].Repeat || evs[1].Count != 2 || evs[1].Cookie != evs[0].Cookie {
		t.Fatalf("records %+v, want the first request, then its 2 repeats at close", evs)
	}

	// A run lasts a second: the same request after it is recorded anew.
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(req string) {
		t.Helper()
		if _, err := c.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if n, err := c.Read(buf); err != nil || !strings.Contains(string(buf[:n]), "200 OK") {
			t.Fatalf("%q: got %q, %v", req, buf[:n], err)
		}
	}
	ask(get)
	time.Sleep(1100 * time.Millisecond)
	ask(get)
	c.Close()
	evs = recs.take(t, 2)
	if evs[0].Repeat || evs[1].Repeat || evs[1].Count != 1 || string(evs[1].Line) == "" {
		t.Fatalf("records %+v, want two whole records a second apart", evs)
	}

	// A refused stream is recorded with why, before its 400.
	bad := "GET /public/../admin HTTP/1.1\r\nHost: deathstar\r\nX-Pad: " + strings.Repeat("p", 80) + "\r\n\r\n"
	if got := statusOf(t, addr, bad); got != 400 {
		t.Fatalf("dot segment: status %d, want 400", got)
	}
	evs = recs.take(t, 1)
	if ev := evs[0]; ev.Verdict != L7Refused || !ev.Answered || !strings.Contains(ev.Reason(), "path") ||
		!strings.HasPrefix(string(ev.Line), "GET /public/../admin ") {
		t.Fatalf("refusal %+v (line %q, reason %q), want the dot segment refused with its reason", ev, ev.Line, ev.Reason())
	}

	// A client that pipelines: its denied request comes before the
	// server answered the one before it. A 403 now would go ahead of that
	// answer, so none is written: the server's answer comes, then the
	// connection is closed.
	c, err = net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	got = pipelineOn(c, "GET "+l7SlowPath+" HTTP/1.1\r\nHost: h\r\n\r\n", exhaust)
	if !strings.Contains(got, "200 OK") || !strings.Contains(got, "GET "+l7SlowPath) || strings.Contains(got, " 403 ") {
		t.Fatalf("pipelined: got %q, want the slow answer and no 403", got)
	}
	if evs = recs.take(t, 2); evs[1].Verdict != L7Denied || !evs[1].Pipelined || evs[1].Answered || !evs[1].Closed {
		t.Fatalf("pipelined denial %+v, want denied, not answered, closed", evs[1])
	}

	// An allowed upgrade is punted (only the server's answer says what
	// follows it): recorded with why, the connection closed.
	rawExchange(t, addr, "GET /public/ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	if ev := recs.take(t, 1)[0]; ev.Verdict != L7Punted || !ev.Upgrade || !ev.Closed || ev.Answered || !strings.Contains(ev.Reason(), "upgrade") {
		t.Fatalf("upgrade %+v (reason %q), want punted and closed, saying why", ev, ev.Reason())
	}

	// A request too short to answer is recorded as denied, closed, not
	// answered.
	rawExchange(t, addr, "PUT / HTTP/1.1\r\nHost: h\r\n\r\n")
	if ev := recs.take(t, 1)[0]; ev.Verdict != L7Denied || ev.Answered || !ev.Closed {
		t.Fatalf("short denial %+v, want denied and closed without an answer", ev)
	}
	recs.none(t)
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.EventsLost != 0 || st.Pipelined != 1 {
		t.Fatalf("%d records lost, %d pipelined denials (want 0, 1)", st.EventsLost, st.Pipelined)
	}
}

// statusOf sends req on a new connection and returns the status of the
// answer, waiting for it up to a few seconds (0: none came).
func statusOf(t *testing.T, addr, req string) int {
	t.Helper()
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

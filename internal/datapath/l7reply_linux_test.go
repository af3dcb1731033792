package datapath

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weirnet/weir/internal/l7"
)

// roundTrips sends a GET of each path on c in turn, as a client that
// does not pipeline: each answer read whole before the next request. It
// returns the statuses.
func roundTrips(t *testing.T, c net.Conn, paths ...string) []int {
	t.Helper()
	rd := bufio.NewReader(c)
	var statuses []int
	for _, p := range paths {
		c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: h\r\n\r\n", p); err != nil {
			t.Fatalf("GET %s: %v", p, err)
		}
		resp, err := http.ReadResponse(rd, nil)
		if err != nil {
			t.Fatalf("GET %s: %v", p, err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Fatalf("GET %s: body: %v", p, err)
		}
		resp.Body.Close()
		statuses = append(statuses, resp.StatusCode)
	}
	return statuses
}

// wantReplies holds records of answers to what they should say: each
// one's status and count, and a latency of at least min (at most a
// quarter second when min is 0).
type wantReply struct {
	status int
	count  uint32
	min    time.Duration
}

func checkReplies(t *testing.T, got []L7Event, want []wantReply, cookie uint64, egress bool) {
	t.Helper()
	for i, ev := range got {
		w := want[i]
		mean := ev.Latency / time.Duration(max(ev.Count, 1))
		switch {
		case ev.Verdict != L7Replied || ev.Status != w.status || ev.Count != w.count || ev.Egress != egress:
			t.Fatalf("answers' record %d %+v: want %d answers of %d (egress %v)", i, ev, w.count, w.status, egress)
		case cookie != 0 && ev.Cookie != cookie:
			t.Fatalf("answers' record %d %+v: want the connection's cookie %d", i, ev, cookie)
		case mean <= 0 || ev.LatencyMax < mean || ev.LatencyMax > ev.Latency:
			t.Fatalf("answers' record %d: latency %v summed, %v at most, over %d answers: inconsistent", i, ev.Latency, ev.LatencyMax, ev.Count)
		case w.min > 0 && mean < w.min:
			t.Fatalf("answers' record %d: mean latency %v, want at least %v", i, mean, w.min)
		case w.min == 0 && ev.LatencyMax > 250*time.Millisecond:
			t.Fatalf("answers' record %d: latency up to %v for an immediate answer", i, ev.LatencyMax)
		}
	}
}

// TestL7ReplyRecords: the server's answers to the requests the kernel
// allowed are recorded with their status and latency, read where the
// server sends them (ingress) or where the client receives them
// (egress). Answers of one status fold into one record, and the run is
// recorded before the next request's record, so each names the request
// recorded before it. An interim answer (100 Continue) is passed over
// for the final one; a long answer sent in several writes counts once; a
// client that pipelines stops the reading of its connection's answers.
func TestL7ReplyRecords(t *testing.T) {
	s, root, cg, recs := attachL7Recorded(t)
	const port = 18680
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	serveHTTPRules(t, s, cg, addr, port, 9, []l7.Rule{{Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/public"}}})

	t.Run("ingress", func(t *testing.T) {
		before := recs.read.Load()
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		got := roundTrips(t, c, "/public/a", "/public/a", "/public/a", l7StatusPath+"503", l7SlowPath, l7BigPath, "/public/a")
		c.Close()
		if fmt.Sprint(got) != "[200 200 200 503 200 200 200]" {
			t.Fatalf("statuses %v", got)
		}
		reqs := recs.take(t, 6) // a, its 2 repeats, 503, slow, big, a
		checkReplies(t, recs.takeReplies(t, 5), []wantReply{{200, 3, 0}, {503, 1, 0}, {200, 1, 300 * time.Millisecond}, {200, 1, 0}, {200, 1, 0}},
			reqs[0].Cookie, false)
		// The first four runs rode on the next request's record; only
		// the last, at the close, is a record of its own.
		if n := recs.read.Load() - before; n != 7 {
			t.Fatalf("%d records for 7 requests (6 records) and their answers, want 7", n)
		}
	})

	t.Run("an interim answer", func(t *testing.T) {
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		io.WriteString(c, "POST /public/upload HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
		br := bufio.NewReader(c)
		line, err := br.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
			t.Fatalf("interim answer %q, %v", line, err)
		}
		br.ReadString('\n') // its blank line
		io.WriteString(c, "body")
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("final answer %v, %v", resp, err)
		}
		c.Close()
		recs.take(t, 1)
		checkReplies(t, recs.takeReplies(t, 1), []wantReply{{200, 1, 0}}, 0, false)
	})

	// After an interim answer the final one is still to come: a denied
	// request pipelined then is not answered in place (the client would
	// read the 403 as the earlier request's answer); the server's answer
	// comes, then the connection closes.
	t.Run("a denial pipelined behind an interim answer", func(t *testing.T) {
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		io.WriteString(c, "POST "+l7SlowPath+" HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
		br := bufio.NewReader(c)
		if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
			t.Fatalf("interim answer %q, %v", line, err)
		}
		br.ReadString('\n')
		io.WriteString(c, "body")
		time.Sleep(30 * time.Millisecond)
		io.WriteString(c, "PUT /private/x HTTP/1.1\r\nHost: h\r\nX-Pad: "+strings.Repeat("p", 80)+"\r\n\r\n")
		// What comes within a second: the server's answer after its
		// 300 ms, and no more (the connection carries nothing after).
		c.SetDeadline(time.Now().Add(time.Second))
		rest, _ := io.ReadAll(br)
		if !strings.HasPrefix(string(rest), "HTTP/1.1 200 ") || strings.Contains(string(rest), " 403 ") {
			t.Fatalf("after the interim answer: %q, want the server's 200 and no 403", rest)
		}
		if evs := recs.take(t, 2); evs[1].Verdict != L7Denied || !evs[1].Pipelined || evs[1].Answered || !evs[1].Closed {
			t.Fatalf("the denial %+v, want not answered (pipelined), closed", evs[1])
		}
		// The server's answer to the upload is read all the same, and
		// recorded when the connection closes.
		c.Close()
		checkReplies(t, recs.takeReplies(t, 1), []wantReply{{200, 1, 300 * time.Millisecond}}, 0, false)
	})

	t.Run("a client that pipelines", func(t *testing.T) {
		before, err := s.Stats()
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		got := pipelineOn(c, "GET /public/p1 HTTP/1.1\r\nHost: h\r\n\r\nGET /public/p2 HTTP/1.1\r\nHost: h\r\n\r\n")
		if strings.Count(got, "200 OK") != 2 {
			t.Fatalf("pipelined: %q, want both answered", got)
		}
		recs.take(t, 2)
		select {
		case ev := <-recs.replies:
			t.Fatalf("answers' record %+v of a pipelining client", ev)
		case <-time.After(300 * time.Millisecond):
		}
		after, err := s.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if after.RepliesLost != before.RepliesLost+1 {
			t.Fatalf("replies_lost %d -> %d, want one more", before.RepliesLost, after.RepliesLost)
		}
	})

	t.Run("egress", func(t *testing.T) {
		k, err := l7.CompileKernel([]l7.Rule{{Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/public"}}}, s.HashKey())
		if err != nil {
			t.Fatal(err)
		}
		if err := s.WriteHTTPSet(3, k); err != nil {
			t.Fatal(err)
		}
		server := netip.MustParseAddrPort("127.0.0.1:18681")
		startHTTPHelper(t, cg, server.String())
		d := &clientDialer{t: t, root: root, cg: cg, out: s.objs.WeirL7Out, server: server}
		c, _ := d.dial([3]uint32{3})
		got := roundTrips(t, c, l7StatusPath+"404", l7StatusPath+"404", l7SlowPath, l7BigPath)
		c.Close()
		if fmt.Sprint(got) != "[404 404 200 200]" {
			t.Fatalf("statuses %v", got)
		}
		reqs := recs.take(t, 4) // 404, its repeat, slow, big
		checkReplies(t, recs.takeReplies(t, 3), []wantReply{{404, 2, 0}, {200, 1, 300 * time.Millisecond}, {200, 1, 0}},
			reqs[0].Cookie, true)
	})
}

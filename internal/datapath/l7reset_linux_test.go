package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weirnet/weir/internal/l7"
)

// resetOutcome is what a client saw on a connection the verdict closed:
// the bytes it read and how reading ended.
type resetOutcome struct {
	got     string
	err     error
	elapsed time.Duration
}

// readUntilError reads c until an error (or 4 s) in the background.
func readUntilError(c net.Conn) <-chan resetOutcome {
	out := make(chan resetOutcome, 1)
	go func() {
		start := time.Now()
		c.SetReadDeadline(start.Add(4 * time.Second))
		var got []byte
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			got = append(got, buf[:n]...)
			if err != nil {
				out <- resetOutcome{string(got), err, time.Since(start)}
				return
			}
		}
	}()
	return out
}

// sweepUntilDone runs ResetClosed until no socket waits, as the agent's
// loop does, for up to 3 s; it returns how many sweeps found one waiting.
func sweepUntilDone(t *testing.T, s *L7Sockets) int {
	t.Helper()
	waited := 0
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		n, err := s.ResetClosed("/proc/self/ns/net")
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return waited
		}
		waited++
	}
	t.Fatal("a closed connection still waits for its reset after 3 s")
	return waited
}

// TestL7ClosedConnectionsReset: a connection the HTTP verdict closes is
// reset, so neither end waits for bytes that will never come, and never
// before what the server owes the client has reached it: a split head's
// connection at once; a 403 that closes its connection only after the
// client has it; a denial pipelined behind a slow request only after the
// server's answer to that request. The reset list is empty after.
func TestL7ClosedConnectionsReset(t *testing.T) {
	s, cg := attachL7ForTest(t)
	const port = 18660
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	serveHTTPRules(t, s, cg, addr, port, 1, []l7.Rule{{Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/public"}}})
	const pad = "X-Padding-For-The-Answer: 0123456789012345678901234567890123456789\r\n"

	for _, tc := range []struct {
		name   string
		pieces []string
		// want is what the client must read before the reset; minWait
		// how long the reset must wait for the server.
		want    string
		minWait time.Duration
	}{
		{"a split head", []string{"GET /public/spl", "it HTTP/1.1\r\nHost: h\r\n\r\n"}, "", 0},
		{"a 403 that closes", []string{"PUT /v1/exhaust-port HTTP/1.1\r\nHost: h\r\n" + pad + "\r\n"}, "HTTP/1.1 403 ", 0},
		{"a denial pipelined behind a slow answer", []string{"GET " + l7SlowPath + " HTTP/1.1\r\nHost: h\r\n\r\n",
			"PUT /v1/exhaust-port HTTP/1.1\r\nHost: h\r\n" + pad + "\r\n"}, "GET " + l7SlowPath, 250 * time.Millisecond},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			before, err := s.Stats()
			if err != nil {
				t.Fatal(err)
			}
			c, err := net.Dial("tcp4", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			outcome := readUntilError(c)
			for i, p := range tc.pieces {
				if i > 0 {
					time.Sleep(30 * time.Millisecond)
				}
				if _, err := c.Write([]byte(p)); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(20 * time.Millisecond) // the verdict has run
			sweepUntilDone(t, s)
			o := <-outcome
			if !errors.Is(o.err, syscall.ECONNRESET) {
				t.Fatalf("the client read %q and then %v after %v, want a reset", o.got, o.err, o.elapsed)
			}
			if !strings.Contains(o.got, tc.want) {
				t.Fatalf("before the reset the client read %q, want %q in it", o.got, tc.want)
			}
			if o.elapsed < tc.minWait {
				t.Fatalf("reset after %v, before the server's answer could go (%v)", o.elapsed, tc.minWait)
			}
			after, err := s.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if after.Reset != before.Reset+1 || after.ResetUnlisted != before.ResetUnlisted {
				t.Fatalf("counters: reset %d -> %d, unlisted %d -> %d; want one reset", before.Reset, after.Reset, before.ResetUnlisted, after.ResetUnlisted)
			}
		})
	}
	if pending := l7ResetPending(s.objs.WeirL7Closing); pending {
		t.Fatal("a socket is still listed for reset")
	}
}

// TestL7ResetForgetsGoneNamespaces: a socket listed for reset in a
// namespace that no longer exists, or at an address no pod holds (its pod
// went), is forgotten by the sweep instead of staying listed.
func TestL7ResetForgetsGoneNamespaces(t *testing.T) {
	s, _ := attachL7ForTest(t)
	now, err := monotonicNow()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.objs.WeirL7Closing.Put(uint64(1<<62), l7L7Closing{SinceNs: now, Local: 0x0100000a}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		netnsOf func(netip.Addr) (string, bool)
	}{
		{"a namespace gone", func(netip.Addr) (string, bool) { return "/var/run/netns/weir-no-such-ns", true }},
		{"an address no pod holds", func(netip.Addr) (string, bool) { return "", false }},
	} {
		if err := s.objs.WeirL7Closing.Put(uint64(1<<62), l7L7Closing{SinceNs: now, Local: 0x0100000a}); err != nil {
			t.Fatal(err)
		}
		n, err := resetClosedL7(&s.objs, tc.netnsOf)
		if err != nil || n != 0 || l7ResetPending(s.objs.WeirL7Closing) {
			t.Fatalf("%s: %d left, %v; want the entry forgotten", tc.name, n, err)
		}
	}
}

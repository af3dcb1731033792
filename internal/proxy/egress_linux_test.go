package proxy

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/testutil"
)

// egressRules: one rule the kernel judges, one it leaves to user space
// (a header value regex).
var egressRules = []l7.Rule{
	{Method: "POST", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/v1/request-landing"}},
	{Method: "GET", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/team"},
		Headers: []l7.HeaderMatch{{Type: l7.HeaderRegularExpression, Name: "x-team", Value: "blu+e"}}},
}

const (
	egressLanding = "POST /v1/request-landing HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 4\r\n\r\nland"
	egressBlue    = "GET /team HTTP/1.1\r\nHost: deathstar\r\nX-Team: bluuue\r\n\r\n"
	egressRed     = "GET /team HTTP/1.1\r\nHost: deathstar\r\nX-Team: red\r\n\r\n"
	egressExhaust = "PUT /v1/exhaust-port HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 4\r\n\r\nboom"
)

// TestHandedEgress: a connection its client's egress policy restricts
// to rules the kernel leaves to user space is handed to the proxy from
// the client's socket at the first request the kernel cannot judge, and
// every later request is judged there: what is allowed goes out on the
// client's own socket (the server sees the client's address, and the
// flow's judged mark moves past exactly those bytes, so tc lets them
// out), what is denied is answered 403 in the server's place on the same
// keep-alive connection, and nothing denied reaches the server. The
// records are the client's egress rules'.
func TestHandedEgress(t *testing.T) {
	srv, s, records, _ := handedSetupWith(t, handedOpts{rules: egressRules, slots: 2, egress: true})
	c, client := dialRestricted(t, s, srv, [3]uint32{1})
	before := outJudged(t, s, client, srv)
	steps := []struct{ req, want string }{
		{egressLanding, "POST /v1/request-landing"}, // judged in the kernel
		{egressBlue, "GET /team"},                   // handed here
		{egressRed, "403 Forbidden"},
		{egressLanding, "POST /v1/request-landing"},
		{egressExhaust, "403 Forbidden"},
		{egressBlue, "GET /team"},
	}
	for i, st := range steps {
		if got := converse(t, c, st.req)[0]; !strings.Contains(got, st.want) {
			t.Fatalf("step %d: %q, want %q", i, got, st.want)
		}
	}
	if got, want := srv.served(), "POST /v1/request-landing\nGET /team\nPOST /v1/request-landing\nGET /team"; got != want {
		t.Fatalf("the server saw\n%s\nwant\n%s", got, want)
	}
	if !srv.peers[client.String()] || len(srv.peers) != 1 {
		t.Fatalf("the server saw clients %v, want only %v: the proxy sends on the client's own socket", srv.peers, client)
	}
	sent := 2*len(egressLanding) + 2*len(egressBlue)
	if moved := outJudged(t, s, client, srv) - before; moved != uint32(sent) {
		t.Fatalf("judged mark moved %d bytes, want the %d allowed", moved, sent)
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Handed != 1 || st.ProxyAnswered != 2 {
		t.Fatalf("counters %+v: want 1 connection handed, 2 answers from the proxy", st)
	}
	recs := waitRecords(t, records, 5)
	for i, want := range []Verdict{Allow, Deny, Allow, Deny, Allow} {
		r := recs[i]
		if !r.Handoff.Egress || r.Handoff.Client != client || r.Decision.Verdict != want {
			t.Fatalf("record %d: %+v, want %v, egress, from %v", i, r, want, client)
		}
	}
}

// TestHandedEgressEnds: a denial behind an allowed request in one write
// is handed too, and the proxy, which cannot answer it before the
// server's answer to the first, sends the first alone and ends the
// connection; the client's later writes fail. With no slot free the
// connection is closed at once, as before the proxy judged egress.
func TestHandedEgressEnds(t *testing.T) {
	srv, s, _, _ := handedSetupWith(t, handedOpts{rules: egressRules, slots: 1, egress: true})
	c, _ := dialRestricted(t, s, srv, [3]uint32{1})
	got := converse(t, c, egressLanding+egressExhaust)[0]
	if !strings.Contains(got, "POST /v1/request-landing") || strings.Contains(got, "403") {
		t.Fatalf("allowed then denied in one write: %q, want the first answered alone", got)
	}
	waitFor(t, time.Second, func() bool {
		_, err := c.Write([]byte(egressLanding))
		return errors.Is(err, syscall.EACCES)
	}, "a write after the proxy ended the connection fails with EACCES")
	if sv := srv.served(); sv != "POST /v1/request-landing" {
		t.Fatalf("the server saw %q, want the one landing", sv)
	}

	// The one slot is busy with a second connection; a third closes.
	busy, _ := dialRestricted(t, s, srv, [3]uint32{1})
	if got := converse(t, busy, egressBlue)[0]; !strings.Contains(got, "GET /team") {
		t.Fatalf("handed: %q", got)
	}
	third, _ := dialRestricted(t, s, srv, [3]uint32{1})
	if _, err := third.Write([]byte(egressBlue)); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("no slot free: %v, want EACCES", err)
	}
}

// TestHandedEgressFollowsPolicy: a policy change reaches a handed
// client connection at its next request, as it does a server's: the
// proxy reads the connection's sets from its weir_l7_out entry for each
// request, so what the new rules deny is answered 403 on the same
// connection and what they allow goes out.
func TestHandedEgressFollowsPolicy(t *testing.T) {
	other := []l7.Rule{{Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/other"}}}
	srv, s, records, _ := handedSetupWith(t, handedOpts{rules: egressRules, more: [][]l7.Rule{other}, slots: 2, egress: true})
	c, client := dialRestricted(t, s, srv, [3]uint32{1})
	if got := converse(t, c, egressBlue)[0]; !strings.Contains(got, "GET /team") {
		t.Fatalf("handed, before the change: %q", got)
	}
	if err := s.RestrictClient(client, netip.MustParseAddrPort(srv.addr), [3]uint32{2}); err != nil {
		t.Fatal(err)
	}
	got := converse(t, c, egressBlue, "GET /other/page HTTP/1.1\r\nHost: deathstar\r\n\r\n")
	if !strings.Contains(got[0], "403 Forbidden") || !strings.Contains(got[1], "GET /other/page") {
		t.Fatalf("after the change: %q, want the team request denied and /other served", got)
	}
	if sv := srv.served(); sv != "GET /team\nGET /other/page" {
		t.Fatalf("the server saw %q", sv)
	}
	recs := waitRecords(t, records, 3)
	if recs[0].Sets != [3]uint32{1} || recs[1].Sets != [3]uint32{2} || recs[2].Decision.Set != 2 {
		t.Fatalf("records %+v: want set 1, then set 2 twice", recs)
	}
}

// dialRestricted connects to srv from a socket of the test's cgroup, its
// connection restricted to sets on the client's side (as tc records one
// its pod's egress policy restricts).
func dialRestricted(t *testing.T, s *datapath.L7Sockets, srv *server, sets [3]uint32) (net.Conn, netip.AddrPort) {
	t.Helper()
	server := netip.MustParseAddrPort(srv.addr)
	var client netip.AddrPort
	d := net.Dialer{Control: testutil.LoopbackBound(func(c netip.AddrPort) error {
		client = c
		return s.RestrictClient(client, server, sets)
	})}
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(srv.cg, "cgroup.procs"), pid, 0); err != nil {
		t.Fatal(err)
	}
	c, derr := d.Dial("tcp4", srv.addr)
	if err := os.WriteFile(filepath.Join(srv.root, "cgroup.procs"), pid, 0); err != nil {
		t.Fatal(err)
	}
	if derr != nil {
		t.Fatal(derr)
	}
	t.Cleanup(func() { c.Close() })
	return c, client
}

// outJudged reads the judged mark of client's connection to srv.
func outJudged(t *testing.T, s *datapath.L7Sockets, client netip.AddrPort, srv *server) uint32 {
	t.Helper()
	j, err := s.ClientJudged(client, netip.MustParseAddrPort(srv.addr))
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// waitRecords waits up to 2 s for n records and returns them: the proxy
// records a read's requests after carrying its steps out.
func waitRecords(t *testing.T, records *[]Record, n int) []Record {
	t.Helper()
	waitFor(t, 2*time.Second, func() bool { return len(*records) >= n }, "the records")
	return *records
}

// waitFor polls cond until it holds or d has passed, then fails with what.
func waitFor(t *testing.T, d time.Duration, cond func() bool, what string) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("not within %v: %s", d, what)
		}
	}
}

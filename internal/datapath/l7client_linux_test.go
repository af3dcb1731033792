package datapath

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

	"github.com/cilium/ebpf"

	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/testutil"
)

// clientDialer makes client sockets as a process in a cgroup of the
// test's does, so the L7 sock_ops program attached there sees their
// handshakes, and records each connection in weir_l7_out (as tc does on
// the SYN of one a client's egress policy restricts) before its SYN.
type clientDialer struct {
	t        *testing.T
	root, cg string
	out      *ebpf.Map
	server   netip.AddrPort
}

// dial connects with the flow recorded restricted to sets, and waits
// for it to be marked joined.
func (d *clientDialer) dial(sets [3]uint32) (net.Conn, netip.AddrPort) {
	t := d.t
	t.Helper()
	var client netip.AddrPort
	dialer := net.Dialer{Control: testutil.LoopbackBound(func(c netip.AddrPort) error {
		client = c
		return d.out.Put(l7FlowKey(d.server, client), l7L7OutFlow{Sets: sets})
	})}
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(d.cg, "cgroup.procs"), pid, 0); err != nil {
		t.Fatal(err)
	}
	c, derr := dialer.Dial("tcp4", d.server.String())
	if err := os.WriteFile(filepath.Join(d.root, "cgroup.procs"), pid, 0); err != nil {
		t.Fatal(err)
	}
	if derr != nil {
		t.Fatal(derr)
	}
	if f := d.flow(client); f.Joined != 1 || f.Cookie == 0 {
		t.Fatalf("connection from %v: flow %+v after the handshake, want joined with its socket's cookie", client, f)
	}
	return c, client
}

// flow reads the connection's weir_l7_out entry.
func (d *clientDialer) flow(client netip.AddrPort) l7L7OutFlow {
	d.t.Helper()
	var f l7L7OutFlow
	if err := d.out.Lookup(l7FlowKey(d.server, client), &f); err != nil {
		d.t.Fatalf("flow of %v: %v", client, err)
	}
	return f
}

// TestL7ClientJudged: a client socket whose connection is recorded in
// weir_l7_out (as tc records one its pod's egress policy restricts)
// joins the egress reader at its handshake, and every request it sends
// is judged before TCP takes it. Allowed requests reach the server and
// move the flow's judged mark past their bytes; a denied one never
// leaves: the client reads a 403 in the server's place and the
// keep-alive connection serves its next request. A head split over
// writes is held until whole and judged whole, allowed or denied. A
// denial behind allowed bytes in one write fails the write and closes
// the connection, and nothing of that write leaves. Every request is
// recorded as judged by the client's egress rules.
func TestL7ClientJudged(t *testing.T) {
	s, root, cg, recs := attachL7Recorded(t)
	k, err := l7.CompileKernel([]l7.Rule{
		{Method: "POST", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/v1/request-landing"}},
		{Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/public"}},
	}, s.HashKey())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WriteHTTPSet(1, k); err != nil {
		t.Fatal(err)
	}
	server := netip.MustParseAddrPort("127.0.0.1:18640")
	startHTTPHelper(t, cg, server.String())
	d := &clientDialer{t: t, root: root, cg: cg, out: s.objs.WeirL7Out, server: server}
	seen := func() string {
		t.Helper()
		return rawExchange(t, server.String(), "GET "+l7SeenPath+" HTTP/1.1\r\nHost: deathstar\r\n\r\n")
	}
	const (
		landing = "POST /v1/request-landing HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 4\r\n\r\nland"
		exhaust = "PUT /v1/exhaust-port HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 4\r\n\r\nboom"
		denied  = "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: 14\r\n\r\nAccess denied\n"
	)

	// Allowed, denied, allowed on one keep-alive connection.
	c, client := d.dial([3]uint32{1})
	before := d.flow(client).Judged
	var got string
	for _, req := range []string{landing, exhaust, landing} {
		got += askOn(t, c, req)
	}
	if strings.Count(got, "POST /v1/request-landing") != 2 || !strings.Contains(got, denied) {
		t.Fatalf("allowed, denied, allowed: %q, want two landings served and the 403 between", got)
	}
	if sv := seen(); strings.Contains(sv, "PUT") {
		t.Fatalf("the server saw a denied request: %q", sv)
	}
	// The mark moved past exactly the allowed bytes: the denied request
	// took no sequence numbers.
	if after := d.flow(client).Judged; after-before != uint32(2*len(landing)) {
		t.Fatalf("judged mark moved %d bytes, want %d", after-before, 2*len(landing))
	}
	c.Close()

	// A head split over writes waits for its rest, and is judged whole.
	c, _ = d.dial([3]uint32{1})
	got = pipelineOn(c, landing[:20], landing[20:])
	if !strings.Contains(got, "POST /v1/request-landing") {
		t.Fatalf("split allowed head: %q, want it served", got)
	}
	c, _ = d.dial([3]uint32{1})
	got = pipelineOn(c, exhaust[:11], exhaust[11:])
	if !strings.HasPrefix(got, denied) {
		t.Fatalf("split denied head: %q, want the 403", got)
	}

	// A denial behind an allowed request in one write: the write fails,
	// nothing of it leaves, and the connection sends no more.
	c, _ = d.dial([3]uint32{1})
	if _, err := c.Write([]byte(landing + exhaust)); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("allowed and denied in one write: %v, want EACCES", err)
	}
	if _, err := c.Write([]byte(landing)); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("a write after the close: %v, want EACCES", err)
	}
	c.Close()
	if sv := seen(); strings.Count(sv, "POST /v1/request-landing") != 3 {
		t.Fatalf("the server saw %q, want the three landings allowed before and nothing of the closed connection", sv)
	}

	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Clients != 4 || st.Corked < 2 || st.Denied != 3 {
		t.Errorf("counters %+v: want 4 clients joined, 2 heads corked at least, 3 denials", st)
	}

	// The records: every request in turn, judged by the client's egress
	// rules, the client as client.
	evs := recs.take(t, 7)
	want := []L7Verdict{L7Allowed, L7Denied, L7Allowed, L7Allowed, L7Denied, L7Allowed, L7Denied}
	for i, ev := range evs {
		if !ev.Egress || ev.Verdict != want[i] || ev.Server != server || ev.Client.Port() == server.Port() || ev.Sets != [3]uint32{1} {
			t.Fatalf("record %d %+v: want %v, egress, from a client to %v, set 1", i, ev, want[i], server)
		}
	}
	if !evs[1].Answered || evs[1].Closed || !strings.HasPrefix(string(evs[1].Line), "PUT /v1/exhaust-port ") || evs[1].Host != "deathstar" {
		t.Fatalf("keep-alive denial %+v (line %q), want answered, open", evs[1], evs[1].Line)
	}
	if evs[6].Answered || !evs[6].Closed {
		t.Fatalf("denial behind allowed bytes %+v, want closed unanswered", evs[6])
	}
	recs.none(t)
}

// attachL7Recorded attaches a standalone L7 path to a new cgroup of the
// test's (root is the cgroup v2 root it is below) and collects its
// records.
func attachL7Recorded(t *testing.T) (s *L7Sockets, root, cg string, recs *recordCollector) {
	t.Helper()
	testutil.RequireRoot(t)
	root, cg = testutil.Cgroup2(t)
	s, err := AttachL7Sockets(cg, L7FlowMaps{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	events, err := s.OpenEventReader()
	if err != nil {
		t.Fatal(err)
	}
	return s, root, cg, collectRecords(t, events)
}

// askOn writes req on c and returns the answer: what arrives within a
// second, up to the first pause.
func askOn(t *testing.T, c net.Conn, req string) string {
	t.Helper()
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatalf("write %q: %v", req, err)
	}
	buf := make([]byte, 4096)
	c.SetReadDeadline(time.Now().Add(time.Second))
	n, _ := c.Read(buf)
	return string(buf[:n])
}

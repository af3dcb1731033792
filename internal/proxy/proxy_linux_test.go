package proxy

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/testutil"
)

// server is an HTTP server whose listener was made inside the cgroup the
// L7 programs watch, answering "<method> <path>" and remembering what it
// served.
type server struct {
	addr     string
	root, cg string // the cgroup v2 root and the test's cgroup
	mu       sync.Mutex
	seen     []string
	peers    map[string]bool // the clients' addresses the server saw
}

func (s *server) served() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.seen, "\n")
}

// listenIn makes a listener as a process in cgroup cg does: the process
// moves into cg for the listen and back to root after. Accepted sockets
// keep their listener's cgroup.
func listenIn(t *testing.T, root, cg string) net.Listener {
	t.Helper()
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), pid, 0); err != nil {
		t.Fatal(err)
	}
	ln, lerr := net.Listen("tcp4", "127.0.0.1:0")
	if err := os.WriteFile(filepath.Join(root, "cgroup.procs"), pid, 0); err != nil {
		t.Fatal(err)
	}
	if lerr != nil {
		t.Fatal(lerr)
	}
	return ln
}

// handedSetup enforces rules on a server's port, with the proxy serving
// slots hand-off slots.
func handedSetup(t *testing.T, rules []l7.Rule, slots int) (*server, *datapath.L7Sockets, *[]Record) {
	srv, s, records, _ := handedSetupLimited(t, rules, slots, Limits{})
	return srv, s, records
}

// handedSetupLimited is handedSetup with the proxy's limits (zero: the
// defaults), returning the proxy too. Sets 2, 3, ... are written from
// more, for EnforceHTTP to switch to.
func handedSetupLimited(t *testing.T, rules []l7.Rule, slots int, limits Limits, more ...[]l7.Rule) (*server, *datapath.L7Sockets, *[]Record, *Proxy) {
	t.Helper()
	return handedSetupWith(t, handedOpts{rules: rules, slots: slots, limits: limits, more: more})
}

// handedOpts: what handedSetupWith sets up. judge, when set, makes the
// proxy's judge from the sets' and the server's port; the port is
// enforced with set port (0: set 1).
type handedOpts struct {
	rules  []l7.Rule
	more   [][]l7.Rule
	slots  int
	limits Limits
	judge  func(sets *SetJudge, port uint16) Judge
	port   uint32
	// h2First: the server speaks HTTP/2 only and sends its SETTINGS at
	// once, before the client's preface, as grpc-go's does.
	h2First bool
	// egress: the rules restrict clients (dialRestricted), not the
	// server's port; the server is outside the test's cgroup.
	egress bool
}

func handedSetupWith(t *testing.T, o handedOpts) (*server, *datapath.L7Sockets, *[]Record, *Proxy) {
	t.Helper()
	rules, more, slots, limits := o.rules, o.more, o.slots, o.limits
	testutil.RequireRoot(t)
	root, cg := testutil.Cgroup2(t)
	s, err := datapath.AttachL7Sockets(cg, datapath.L7FlowMaps{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	var ln net.Listener
	if o.egress {
		if ln, err = net.Listen("tcp4", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	} else {
		ln = listenIn(t, root, cg)
	}
	srv := &server{addr: ln.Addr().String(), root: root, cg: cg, peers: map[string]bool{}}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.mu.Lock()
		srv.seen = append(srv.seen, r.Method+" "+r.URL.Path)
		srv.peers[r.RemoteAddr] = true
		srv.mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/echo.Echo/") {
			echoStream(w, r)
			return
		}
		io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "%s %s", r.Method, r.URL.Path)
	})}
	// HTTP/1 and HTTP/2 over cleartext (prior knowledge), as a gRPC
	// server speaks it.
	hs.Protocols = new(http.Protocols)
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	if o.h2First {
		go serveH2First(ln, hs.Handler)
		t.Cleanup(func() { ln.Close() })
	} else {
		go hs.Serve(ln)
		t.Cleanup(func() { hs.Close() })
	}

	var sets Matchers
	for i, rules := range append([][]l7.Rule{rules}, more...) {
		k, err := l7.CompileKernel(rules, s.HashKey())
		if err != nil {
			t.Fatal(err)
		}
		if err := s.WriteHTTPSet(uint32(i+1), k); err != nil {
			t.Fatal(err)
		}
		m, err := l7.Compile(rules)
		if err != nil {
			t.Fatal(err)
		}
		sets.Put(uint32(i+1), m)
	}
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	set := o.port
	if set == 0 {
		set = 1
	}
	if !o.egress {
		if err := s.EnforceHTTP(port, set); err != nil {
			t.Fatal(err)
		}
	}
	var judge Judge = NewSetJudge(sets.Get)
	if o.judge != nil {
		judge = o.judge(NewSetJudge(sets.Get), port)
	}
	var (
		mu      sync.Mutex
		records []Record
	)
	opener := s.Proxy()
	t.Cleanup(func() { opener.Close() })
	px := New(judge, opener, func(r Record) {
		mu.Lock()
		records = append(records, r)
		mu.Unlock()
	}, slog.New(slog.DiscardHandler))
	px.SetLimits(limits)
	if err := px.Start(slots); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	return srv, s, &records, px
}

// converse writes each piece on c, 30 ms apart, and returns what came back
// after each (read until 300 ms of quiet).
func converse(t *testing.T, c net.Conn, pieces ...string) []string {
	t.Helper()
	var out []string
	buf := make([]byte, 64<<10)
	for _, p := range pieces {
		if _, err := c.Write([]byte(p)); err != nil {
			out = append(out, "write: "+err.Error())
			continue
		}
		var got []byte
		for {
			c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			n, err := c.Read(buf)
			got = append(got, buf[:n]...)
			if err != nil {
				break
			}
		}
		out = append(out, string(got))
	}
	return out
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var handedRules = []l7.Rule{
	{Method: "GET", Path: &l7.PathMatch{Type: l7.PathRegularExpression, Value: "/items/[0-9]+"}},
	{Method: "POST", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/v1/request-landing"}},
}

// TestHandedConnections: what the kernel cannot judge is judged in user
// space on the same connection, with real sockets: a head split over two
// writes is assembled and served; a request only a regular expression can
// allow is served or answered 403; after a 403 the connection goes on; a
// denied split head never reaches the server; a slot serves connection
// after connection; and no request of the smuggling corpus, cut in two
// anywhere, reaches the server unless the rules allow it.
func TestHandedConnections(t *testing.T) {
	srv, s, records := handedSetup(t, handedRules, 4)

	c := dial(t, srv.addr)
	got := converse(t, c,
		"GET /ite", "ms/42 HTTP/1.1\r\nHost: h\r\n\r\n", // split: handed
		"GET /items/43 HTTP/1.1\r\nHost: h\r\n\r\n", // read in user space from now on
		"GET /secret HTTP/1.1\r\nHost: h\r\n\r\n",
		"POST /v1/request-landing HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nland")
	want := []string{"", "GET /items/42", "GET /items/43", "HTTP/1.1 403 Forbidden", "POST /v1/request-landing"}
	for i, w := range want {
		if w == "" && got[i] != "" || !strings.Contains(got[i], w) {
			t.Fatalf("step %d: got %q, want %q", i, got[i], w)
		}
	}

	// One write, a path only the regular expression can allow: the
	// kernel's automaton allows it; the next is denied, too short for a
	// 403 in its place, and handed to user space, which answers it.
	if got := converse(t, dial(t, srv.addr), "GET /items/7 HTTP/1.1\r\nHost: h\r\n\r\n", "GET /items/x HTTP/1.1\r\nHost: h\r\n\r\n"); !strings.Contains(got[0], "GET /items/7") || !strings.HasPrefix(got[1], "HTTP/1.1 403 ") {
		t.Fatalf("regular expression: %q", got)
	}

	// A denied split head never reaches the server.
	if got := converse(t, dial(t, srv.addr), "GET /sec", "ret-split HTTP/1.1\r\nHost: h\r\n\r\n"); !strings.HasPrefix(got[1], "HTTP/1.1 403 ") {
		t.Fatalf("denied split head: %q", got)
	}

	// More connections than slots, one after another: each slot serves
	// one, then a fresh pair serves the next.
	for i := range 10 {
		c, err := net.Dial("tcp4", srv.addr)
		if err != nil {
			t.Fatal(err)
		}
		path := fmt.Sprintf("/items/%d", 100+i)
		got := converse(t, c, "GET "+path[:5], path[5:]+" HTTP/1.1\r\nHost: h\r\n\r\n")
		c.Close()
		if !strings.Contains(got[1], "GET "+path) {
			t.Fatalf("connection %d: %q", i, got)
		}
		time.Sleep(250 * time.Millisecond) // the slot sees the close
	}

	if list := srv.served(); strings.Contains(list, "secret") || strings.Contains(list, "/items/x") {
		t.Fatalf("a denied request reached the server:\n%s", list)
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats %+v", st)
	if st.Handed < 13 || st.ProxyForwarded == 0 || st.ProxyAnswered < 3 {
		t.Fatalf("counters %+v: want 13 connections handed, bytes forwarded, 3 answers", st)
	}
	// The records name the connection as the kernel's do.
	if len(*records) < 16 {
		t.Fatalf("%d requests recorded by the proxy, want every one it judged", len(*records))
	}
	for _, r := range *records {
		if r.Handoff.Server.String() != srv.addr || !r.Handoff.Client.Addr().IsLoopback() || r.Handoff.Cookie == 0 || r.Handoff.Sets != [3]uint32{1} {
			t.Fatalf("record of %v: handed connection %+v, want the server %s and its client", r.Request, r.Handoff, srv.addr)
		}
	}
}

// TestHandedSmuggling: every stream of the smuggling corpus, cut in two
// at several places (so the kernel hands it over mid-head), through the
// proxy: the server never serves /admin, which no rule allows.
func TestHandedSmuggling(t *testing.T) {
	rules := []l7.Rule{
		{Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/public"}},
		{Method: "POST", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/public"}},
		handedRules[0],
	}
	srv, s, records := handedSetup(t, rules, 64)
	type cut struct {
		stream []byte
		at     int
	}
	var cuts []cut
	for _, stream := range testutil.SmugglingStreams(t) {
		for _, at := range []int{1, len(stream) / 3, len(stream) / 2, len(stream) - 2} {
			if at > 0 && at < len(stream) {
				cuts = append(cuts, cut{stream, at})
			}
		}
	}
	for len(cuts) > 0 {
		batch := cuts[:min(32, len(cuts))]
		cuts = cuts[len(batch):]
		var wg sync.WaitGroup
		for _, c := range batch {
			wg.Add(1)
			go func() {
				defer wg.Done()
				conn, err := net.Dial("tcp4", srv.addr)
				if err != nil {
					t.Error(err)
					return
				}
				defer conn.Close()
				converse(t, conn, string(c.stream[:c.at]), string(c.stream[c.at:]))
			}()
		}
		wg.Wait()
		time.Sleep(300 * time.Millisecond) // the slots see the closes
	}
	if list := srv.served(); strings.Contains(list, "/admin") {
		t.Fatalf("a smuggled request reached the server:\n%s", list)
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats %+v, %d requests judged in user space", st, len(*records))
	if st.Handed < 100 {
		t.Fatalf("only %d streams handed to the proxy: the test did not exercise it", st.Handed)
	}
}

// TestProxyLimits: handed connections cannot keep the node's few slots.
// With one slot, a client that sends half a head and waits loses it after
// the head timeout (recorded 408, reset, and its late rest never served),
// and the slot serves the next connection; a connection silent for the
// idle timeout (when set) is ended likewise; a head sent a byte at a
// time runs out of time as well.
func TestProxyLimits(t *testing.T) {
	limits := Limits{HeadTimeout: 600 * time.Millisecond, IdleTimeout: 2 * time.Second, ClientShare: 100}
	srv, s, records, px := handedSetupLimited(t, handedRules, 1, limits)
	resets := func() int {
		t.Helper()
		n, err := s.ResetClosed("/proc/self/ns/net")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	slow := dial(t, srv.addr)
	converse(t, slow, "GET /items/1")
	time.Sleep(limits.HeadTimeout + 2*pollClosed)
	resets()
	if got := converse(t, slow, "23 HTTP/1.1\r\nHost: h\r\n\r\n"); got[0] != "" && !strings.HasPrefix(got[0], "write: ") {
		t.Fatalf("a head finished after the timeout was answered %q", got)
	}
	if strings.Contains(srv.served(), "/items/123") {
		t.Fatal("a head finished after the timeout reached the server")
	}
	if rs := *records; len(rs) != 1 || rs[0].Err == nil || rs[0].Err.Status != 408 || !rs[0].Ended {
		t.Fatalf("records %+v, want one refusal with status 408", rs)
	}
	// The only slot is free again once the slot sees the close.
	time.Sleep(3 * pollClosed)
	next := dial(t, srv.addr)
	if got := converse(t, next, "GET /ite", "ms/2 HTTP/1.1\r\nHost: h\r\n\r\n"); !strings.Contains(got[1], "GET /items/2") {
		t.Fatalf("the slot after a head timeout: %q", got)
	}
	// next now waits without a byte: the idle timeout ends it.
	time.Sleep(limits.IdleTimeout + 2*pollClosed)
	resets()
	if got := converse(t, next, "GET /items/3 HTTP/1.1\r\nHost: h\r\n\r\n"); strings.Contains(got[0], "/items/3") {
		t.Fatalf("an idle connection kept being served: %q", got)
	}
	// A head sent a byte at a time, never 200 ms apart: its read never
	// times out, and its clock still runs out.
	time.Sleep(3 * pollClosed)
	drip := dial(t, srv.addr)
	converse(t, drip, "GET /ite") // split: handed
	for _, b := range "ms/77 HTTP/1.1\r\nHost: h\r\n" {
		if _, err := drip.Write([]byte(string(b))); err != nil {
			break
		}
		time.Sleep(60 * time.Millisecond)
	}
	resets()
	if got := converse(t, drip, "\r\n"); strings.Contains(got[0], "/items/77") {
		t.Fatalf("a head dripped past the timeout was served: %q", got)
	}
	if st := px.Stats(); st.HeadTimeouts != 2 || st.IdleEnds != 1 || st.Busy != 0 {
		t.Fatalf("stats %+v, want two head timeouts, one idle end, no slot busy", st)
	}
}

// TestProxyClientShare: while a quarter of the slots or fewer are free, a
// client address holding its share is refused more; other addresses are
// not, and without pressure nobody is.
func TestProxyClientShare(t *testing.T) {
	srv, _, records, px := handedSetupLimited(t, handedRules, 4, Limits{HeadTimeout: time.Minute, IdleTimeout: time.Minute, ClientShare: 2})
	hold := func(local string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
		c, err := d.Dial("tcp4", srv.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		converse(t, c, "GET /items/1")
		return c
	}
	// Three slots held by 127.0.0.1, over its share of 2: there was no
	// pressure while the first three came (free > 1).
	for range 3 {
		hold("127.0.0.1")
	}
	if st := px.Stats(); st.Busy != 3 || st.ClientShareEnds != 0 {
		t.Fatalf("stats %+v, want 3 slots busy, none refused", st)
	}
	// One slot left (pressure): 127.0.0.1 is over its share, refused.
	over := hold("127.0.0.1")
	if got := converse(t, over, "0 HTTP/1.1\r\nHost: h\r\n\r\n"); strings.Contains(got[0], "/items/10") {
		t.Fatalf("a client over its share was served: %q", got)
	}
	time.Sleep(3 * pollClosed) // its slot is recycled
	// Another address takes the last slot and is served.
	other := hold("127.0.0.2")
	if got := converse(t, other, "1 HTTP/1.1\r\nHost: h\r\n\r\n"); !strings.Contains(got[0], "GET /items/11") {
		t.Fatalf("another client under pressure: %q", got)
	}
	st := px.Stats()
	if st.ClientShareEnds != 1 || st.Busy != 4 {
		t.Fatalf("stats %+v, want one connection refused for its client's share, 4 slots busy", st)
	}
	var refused int
	for _, r := range *records {
		if r.Err != nil && r.Err.Status == 503 {
			refused++
		}
	}
	if refused != 1 {
		t.Fatalf("records %+v: want one refusal for the client's share", *records)
	}
}

// TestHandedConnectionsFollowPolicy: a policy change reaches a handed
// connection at its next request, as it does one the kernel reads: what
// the new rules deny is answered 403, what they allow is served, and the
// record names the sets the request was judged against.
func TestHandedConnectionsFollowPolicy(t *testing.T) {
	other := []l7.Rule{{Method: "GET", Path: &l7.PathMatch{Type: l7.PathRegularExpression, Value: "/other/[a-z]+"}}}
	srv, s, records, _ := handedSetupLimited(t, handedRules, 2, Limits{}, other)
	c := dial(t, srv.addr)
	if got := converse(t, c, "GET /ite", "ms/42 HTTP/1.1\r\nHost: h\r\n\r\n"); !strings.Contains(got[1], "GET /items/42") {
		t.Fatalf("before the change: %q", got)
	}
	port := uint16(c.RemoteAddr().(*net.TCPAddr).Port)
	if err := s.EnforceHTTP(port, 2); err != nil {
		t.Fatal(err)
	}
	got := converse(t, c, "GET /items/43 HTTP/1.1\r\nHost: h\r\n\r\n", "GET /other/page HTTP/1.1\r\nHost: h\r\n\r\n")
	if !strings.HasPrefix(got[0], "HTTP/1.1 403 ") || !strings.Contains(got[1], "GET /other/page") {
		t.Fatalf("after the change: %q", got)
	}
	if strings.Contains(srv.served(), "/items/43") {
		t.Fatal("a request the new rules deny reached the server")
	}
	rs := *records
	if len(rs) != 3 || rs[0].Sets != [3]uint32{1} || rs[1].Sets != [3]uint32{2} || rs[2].Sets != [3]uint32{2} || rs[2].Decision.Set != 2 {
		t.Fatalf("records %+v: want set 1, then set 2 twice", rs)
	}
}

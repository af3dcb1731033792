package datapath

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/weirnet/weir/internal/l7"
)

// l7HTTPHelperEnv makes the test binary an HTTP server (TestL7HTTPHelper)
// on the address it names, in the cgroup the L7 programs watch.
const l7HTTPHelperEnv = "WEIR_L7_HTTP_HELPER"

// l7SeenPath answers the paths the helper served, one a line, itself
// last: the test's way to know a denied request never reached it.
const l7SeenPath = "/public/seen"

// l7SlowPath is answered after 300 ms.
const l7SlowPath = "/public/slow"

// l7StatusPath+"NNN" is answered with status NNN.
const l7StatusPath = "/public/status/"

// l7BigPath is answered with a body of 256 KiB, written in four sends.
const l7BigPath = "/public/big"

// TestL7HTTPHelper is not a test: run with l7HTTPHelperEnv set, it
// serves HTTP until killed, answering "<method> <path>" to every request.
func TestL7HTTPHelper(t *testing.T) {
	addr := os.Getenv(l7HTTPHelperEnv)
	if addr == "" {
		return
	}
	network := "tcp4"
	if strings.HasPrefix(addr, "[") {
		network = "tcp" // [::]: IPv4 clients get IPv4-mapped AF_INET6 sockets
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var mu sync.Mutex
	var seen []string
	fmt.Println("listening")
	http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if strings.HasPrefix(r.URL.Path, l7SlowPath) {
			time.Sleep(300 * time.Millisecond) // an answer still to come when the next request arrives
		}
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path)
		list := strings.Join(seen, "\n")
		mu.Unlock()
		switch {
		case r.URL.Path == l7SeenPath:
			io.WriteString(w, list)
			return
		case strings.HasPrefix(r.URL.Path, l7StatusPath):
			code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, l7StatusPath))
			w.WriteHeader(code)
		case r.URL.Path == l7BigPath:
			w.Header().Set("Content-Length", strconv.Itoa(256<<10))
			for range 4 {
				w.Write([]byte(strings.Repeat("b", 64<<10)))
				w.(http.Flusher).Flush()
			}
			return
		}
		fmt.Fprintf(w, "%s %s", r.Method, r.URL.Path)
	}))
	os.Exit(3)
}

// startHTTPHelper runs TestL7HTTPHelper in cgroup cg on addr until the
// test ends.
func startHTTPHelper(t *testing.T, cg, addr string) {
	t.Helper()
	startHelperIn(t, cg, "TestL7HTTPHelper", l7HTTPHelperEnv, addr)
}

// rawExchange writes each piece (a pause between, so each is its own
// skb) on a new connection and returns what came back before the
// connection closed or went quiet. Before each piece after the first it
// waits for an answer to what it sent, up to a second, as a client that
// does not pipeline does (a piece that is part of a head gets none).
func rawExchange(t *testing.T, addr string, pieces ...string) string {
	t.Helper()
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	return exchangeOn(c, pieces...)
}

// exchangeOn is rawExchange on a connection of the caller's; it closes c.
func exchangeOn(c net.Conn, pieces ...string) string {
	return exchange(c, true, pieces...)
}

// pipelineOn writes the pieces 30 ms apart without waiting for answers,
// as a client that pipelines does; it closes c.
func pipelineOn(c net.Conn, pieces ...string) string {
	return exchange(c, false, pieces...)
}

func exchange(c net.Conn, inTurn bool, pieces ...string) string {
	defer c.Close()
	var got []byte
	buf := make([]byte, 64<<10)
	for i, p := range pieces {
		if i > 0 {
			time.Sleep(30 * time.Millisecond)
			if inTurn {
				c.SetReadDeadline(time.Now().Add(time.Second))
				n, _ := c.Read(buf)
				got = append(got, buf[:n]...)
			}
		}
		if _, err := c.Write([]byte(p)); err != nil {
			break
		}
	}
	c.SetReadDeadline(time.Now().Add(400 * time.Millisecond))
	b, _ := io.ReadAll(c)
	return string(append(got, b...))
}

// serveHTTPRules compiles rules as set, enforces them on port and starts
// the helper server at addr; it returns the compiled set.
func serveHTTPRules(t *testing.T, s *L7Sockets, cg, addr string, port uint16, set uint32, rules []l7.Rule) *l7.KernelRules {
	t.Helper()
	k, err := l7.CompileKernel(rules, s.HashKey())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WriteHTTPSet(set, k); err != nil {
		t.Fatal(err)
	}
	if err := s.EnforceHTTP(port, set); err != nil {
		t.Fatal(err)
	}
	startHTTPHelper(t, cg, addr)
	return k
}

// TestL7HTTPEnforced: a port's requests are read and judged in the
// kernel, with real sockets: allowed requests reach the server and are
// answered by it; a denied one is answered 403 in place and never reaches
// it, first or second on a keep-alive connection; a malformed one gets
// 400; a head split over two skbs is never handed over in part; every
// request of the smuggling corpus that the rules do not allow is kept
// from the server; and each socket's reader state goes when it closes.
func TestL7HTTPEnforced(t *testing.T) {
	s, cg := attachL7ForTest(t)
	const port = 18600
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	rules := []l7.Rule{
		{Method: "POST", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/v1/request-landing"}},
		{Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/public"}},
		{Method: "POST", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/public"}},
	}
	serveHTTPRules(t, s, cg, addr, port, 1, rules)
	seen := func() string {
		t.Helper()
		got := rawExchange(t, addr, "GET "+l7SeenPath+" HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
		if _, body, ok := strings.Cut(got, "\r\n\r\n"); ok {
			return body
		}
		t.Fatalf("asking the server what it saw: %q", got)
		return ""
	}

	// The deathstar: POST /v1/request-landing allowed, PUT
	// /v1/exhaust-port denied, on one keep-alive connection.
	got := rawExchange(t, addr,
		"POST /v1/request-landing HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 4\r\n\r\nland",
		"PUT /v1/exhaust-port HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 4\r\n\r\nboom")
	if !strings.Contains(got, "200 OK") || !strings.Contains(got, "POST /v1/request-landing") || !strings.Contains(got, "HTTP/1.1 403 ") {
		t.Fatalf("deathstar: got %q, want a 200 for the landing, then a 403", got)
	}
	if strings.Contains(seen(), "exhaust-port") {
		t.Fatal("the denied PUT reached the server")
	}

	// A server listening on [::], as Go, Node and the JVM do by default:
	// an IPv4 client's socket is AF_INET6 with mapped addresses, and is
	// judged all the same.
	const dualPort = port + 1
	if err := s.EnforceHTTP(dualPort, 1); err != nil {
		t.Fatal(err)
	}
	startHTTPHelper(t, cg, fmt.Sprintf("[::]:%d", dualPort))
	got = rawExchange(t, fmt.Sprintf("127.0.0.1:%d", dualPort),
		"PUT /v1/exhaust-port HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 4\r\n\r\nboom")
	if !strings.HasPrefix(got, "HTTP/1.1 403 ") {
		t.Fatalf("a denied request to a server on [::]: %q, want 403", got)
	}

	// A short request (37 bytes) gets the short 403, too short to say
	// Connection: close, and keeps its connection.
	got = rawExchange(t, addr, "GET /xyz HTTP/1.1\r\nHost: abcdefgh\r\n\r\n", "GET /public/after HTTP/1.1\r\nHost: a\r\n\r\n")
	if !strings.HasPrefix(got, "HTTP/1.1 403 ") || strings.Contains(got, "close") || !strings.Contains(got, "GET /public/after") {
		t.Fatalf("short denied request, then an allowed one: %q", got)
	}
	// Under 35 bytes no 403 fits: the request is dropped, and so is all
	// that follows on its connection.
	got = rawExchange(t, addr, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n", "GET /public/dropped HTTP/1.1\r\nHost: a\r\n\r\n")
	if got != "" || strings.Contains(seen(), "/public/dropped") {
		t.Fatalf("a 28-byte denied request: got %q, want nothing and nothing served after it", got)
	}

	// Malformed: 400, nothing reaches the server.
	got = rawExchange(t, addr, "GET /public/../admin HTTP/1.1\r\nHost: h\r\nX-Padding-For-The-Answer: 0123456789012345678901234567890123456789\r\n\r\n")
	if !strings.HasPrefix(got, "HTTP/1.1 400 Bad Request") {
		t.Fatalf("dot-dot path: %q, want 400", got)
	}

	// An allowed upgrade: after it the bytes may not be HTTP, or may be
	// if the server declines, so the kernel does not judge on: dropped
	// (user space decides, once it exists).
	before, _ := s.Stats()
	got = rawExchange(t, addr, "GET /public/ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	after, _ := s.Stats()
	if got != "" || after.Punted != before.Punted+1 || strings.Contains(seen(), "/public/ws") {
		t.Fatalf("upgrade: got %q, punted %d -> %d; want it held back", got, before.Punted, after.Punted)
	}

	// A head split over two skbs is never handed over in part.
	before, _ = s.Stats()
	got = rawExchange(t, addr, "GET /public/spl", "it HTTP/1.1\r\nHost: h\r\n\r\n")
	after, _ = s.Stats()
	if got != "" || after.Split != before.Split+1 || strings.Contains(seen(), "/public/split") {
		t.Fatalf("split head: got %q, split count %d -> %d; want no answer, one split, nothing served", got, before.Split, after.Split)
	}

	// Every smuggling attempt of internal/l7's corpus: the server never
	// sees /admin.
	var wg sync.WaitGroup
	for _, stream := range readerCorpus(t) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp4", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			c.Write(stream)
			c.SetReadDeadline(time.Now().Add(time.Second))
			io.ReadAll(c)
		}()
	}
	wg.Wait()
	if list := seen(); strings.Contains(list, "/admin") || strings.Contains(list, "exhaust") {
		t.Fatalf("a denied request reached the server:\n%s", list)
	}

	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats: %+v", st)
	if st.Allowed == 0 || st.Denied == 0 || st.Refused == 0 || st.Answered == 0 || st.JoinFail != 0 || st.NoState != 0 {
		t.Errorf("counters: %+v", st)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		n, err := s.HTTPConnections()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sockets' reader state left after every connection closed", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestL7HTTPHeaderRules: header conditions judged in the kernel, with
// real sockets. A request with both headers a rule names (value exact,
// OWS around it ignored) reaches the server; one missing, or with its
// value in another case, is answered 403; one repeating a header the
// rules name is answered 400; a second set naming other headers grows
// the watch list, and deleting both empties it.
func TestL7HTTPHeaderRules(t *testing.T) {
	s, cg := attachL7ForTest(t)
	const port = 18640
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	rules := []l7.Rule{
		{Method: "PUT", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/v1/exhaust-port"}, Headers: []l7.HeaderMatch{
			{Type: l7.HeaderExact, Name: "X-Role", Value: "vader"}, {Type: l7.HeaderPresent, Name: "X-Trace"}}},
		{Method: "GET", Headers: []l7.HeaderMatch{{Type: l7.HeaderExact, Name: "x-fleet", Value: "imperial star"}}},
	}
	k := serveHTTPRules(t, s, cg, addr, port, 1, rules)
	const pad = "X-Padding-For-The-Answer: 0123456789012345678901234567890123456789\r\n"
	for _, tc := range []struct {
		name, head, want string
	}{
		{"both headers", "PUT /v1/exhaust-port HTTP/1.1\r\nHost: h\r\nx-role: vader\r\nX-Trace: 1\r\n" + pad + "\r\n", "200 OK"},
		{"OWS around the value", "PUT /v1/exhaust-port HTTP/1.1\r\nHost: h\r\nX-ROLE: \t vader  \r\nX-Trace:\r\n" + pad + "\r\n", "200 OK"},
		{"inner whitespace kept", "GET /x HTTP/1.1\r\nHost: h\r\nX-Fleet:  imperial star \r\n" + pad + "\r\n", "200 OK"},
		{"inner whitespace differs", "GET /x HTTP/1.1\r\nHost: h\r\nX-Fleet: imperial  star\r\n" + pad + "\r\n", "HTTP/1.1 403 "},
		{"one header missing", "PUT /v1/exhaust-port HTTP/1.1\r\nHost: h\r\nX-Role: vader\r\n" + pad + "\r\n", "HTTP/1.1 403 "},
		{"value in another case", "PUT /v1/exhaust-port HTTP/1.1\r\nHost: h\r\nX-Role: Vader\r\nX-Trace: 1\r\n" + pad + "\r\n", "HTTP/1.1 403 "},
		{"a header the rules name, twice", "PUT /v1/exhaust-port HTTP/1.1\r\nHost: h\r\nX-Role: vader\r\nX-Trace: 1\r\nx-role: rebel\r\n" + pad + "\r\n", "HTTP/1.1 400 "},
	} {
		got := rawExchange(t, addr, tc.head)
		if !strings.Contains(got, tc.want) {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
	names := func() uint32 {
		t.Helper()
		var w l7L7HeaderWatch
		if err := s.objs.WeirL7HeaderWatch.Lookup(uint32(0), &w); err != nil {
			t.Fatal(err)
		}
		return w.Count
	}
	if n := names(); n != 3 {
		t.Fatalf("%d header names watched, want 3", n)
	}
	k2, err := l7.CompileKernel([]l7.Rule{{Headers: []l7.HeaderMatch{{Type: l7.HeaderPresent, Name: "X-Trace"}, {Type: l7.HeaderPresent, Name: "Authorization"}}}}, s.HashKey())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WriteHTTPSet(2, k2); err != nil {
		t.Fatal(err)
	}
	if n := names(); n != 4 {
		t.Fatalf("%d header names watched with a second set, want 4", n)
	}
	if err := s.DeleteHTTPSet(1, k); err != nil {
		t.Fatal(err)
	}
	if n := names(); n != 2 {
		t.Fatalf("%d header names watched after the first set's deletion, want 2", n)
	}
	if err := s.DeleteHTTPSet(2, k2); err != nil {
		t.Fatal(err)
	}
	if n := names(); n != 0 {
		t.Fatalf("%d header names watched with no set, want 0", n)
	}
}

// TestHeaderWatchFailsClosed: a set whose header names would take the
// watch list past its size is not written, and leaves the list as it
// was.
func TestHeaderWatchFailsClosed(t *testing.T) {
	s, _ := attachL7ForTest(t)
	for i := 0; i < l7.MaxWatchedHeaders/2; i++ {
		rules := []l7.Rule{{Headers: []l7.HeaderMatch{
			{Type: l7.HeaderPresent, Name: fmt.Sprintf("x-a%d", i)}, {Type: l7.HeaderPresent, Name: fmt.Sprintf("x-b%d", i)}}}}
		k, err := l7.CompileKernel(rules, s.HashKey())
		if err != nil {
			t.Fatal(err)
		}
		if err := s.WriteHTTPSet(uint32(i+1), k); err != nil {
			t.Fatal(err)
		}
	}
	k, err := l7.CompileKernel([]l7.Rule{{Headers: []l7.HeaderMatch{{Type: l7.HeaderPresent, Name: "x-one-more"}}}}, s.HashKey())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WriteHTTPSet(99, k); !errors.Is(err, l7.ErrTooManyRules) {
		t.Fatalf("a 17th header name: %v, want ErrTooManyRules", err)
	}
	var row l7L7Set
	if err := s.objs.WeirL7Sets.Lookup(uint32(99), &row); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("the set over the watch list has a row (%v): it must stay closed", err)
	}
	var w l7L7HeaderWatch
	if err := s.objs.WeirL7HeaderWatch.Lookup(uint32(0), &w); err != nil || w.Count != l7.MaxWatchedHeaders {
		t.Fatalf("watch list: %d names (%v), want %d", w.Count, err, l7.MaxWatchedHeaders)
	}
}

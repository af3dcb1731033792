package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/testutil"
)

// echoStream answers a gRPC-like call: each line of the request body is
// sent back as it comes (a bidirectional stream), then a trailer.
func echoStream(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Trailer", "Grpc-Status")
	w.Header().Set("Content-Type", "application/grpc")
	w.WriteHeader(http.StatusOK)
	flush := http.NewResponseController(w)
	flush.EnableFullDuplex()
	flush.Flush()
	sc := bufio.NewScanner(r.Body)
	for sc.Scan() {
		fmt.Fprintf(w, "echo %s\n", sc.Text())
		flush.Flush()
	}
	w.Header().Set("Grpc-Status", "0")
}

// h2cClient speaks HTTP/2 over cleartext with prior knowledge, as gRPC
// clients do, on one connection per address.
func h2cClient(t *testing.T) *http.Client {
	return h2cClientVia(t, nil)
}

// h2cClientVia is h2cClient making its connections with dial (nil: a
// plain dial).
func h2cClientVia(t *testing.T, dial func() net.Conn) *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	if dial != nil {
		tr.DialContext = func(context.Context, string, string) (net.Conn, error) { return dial(), nil }
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

var h2cRules = []l7.Rule{
	{Method: "GET", Path: &l7.PathMatch{Type: l7.PathRegularExpression, Value: "/items/[0-9]+"}},
	{Method: "POST", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/v1/request-landing"}},
	// gRPC: method POST, path /package.Service/Method.
	{Method: "POST", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/echo.Echo"}},
	{Method: "GET", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/team"},
		Headers: []l7.HeaderMatch{{Type: l7.HeaderExact, Name: "x-team", Value: "blue"}}},
}

// call makes one request and returns "status body", noting whether the
// client reused a connection.
func call(t *testing.T, c *http.Client, method, url, body string, header map[string]string, reused *int) string {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	var mu sync.Mutex
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		if i.Reused && reused != nil {
			mu.Lock()
			*reused++
			mu.Unlock()
		}
	}}))
	res, err := c.Do(req)
	if err != nil {
		return "error: " + err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.ProtoMajor != 2 {
		t.Fatalf("%s %s answered over %s, want HTTP/2", method, url, res.Proto)
	}
	return fmt.Sprintf("%d %s", res.StatusCode, b)
}

// TestHandedH2C: a connection that opens with the HTTP/2 preface is
// handed whole to the proxy, which speaks HTTP/2 with both ends over real
// sockets: on one connection, allowed requests are served, denied ones
// answered 403 on their own stream while the connection goes on, a header
// rule (user space) and a regular expression are judged, many streams at
// once each get their own verdict, a gRPC-like call streams both ways
// with its trailer, and no denied request reaches the server. Every
// request is recorded with the server's status.
func TestHandedH2C(t *testing.T) {
	srv, s, records, _ := handedSetupWith(t, handedOpts{rules: h2cRules, slots: 4})
	checkH2C(t, h2cClient(t), srv, s, records)
}

// TestHandedH2CServerFirst: the same with a server that sends its
// SETTINGS before the client's preface arrives (grpc-go's does): the
// kernel hands the connection over at the server's first bytes, so they
// reach the proxy's HTTP/2 client, not the client.
func TestHandedH2CServerFirst(t *testing.T) {
	srv, s, records, _ := handedSetupWith(t, handedOpts{rules: h2cRules, slots: 4, h2First: true})
	checkH2C(t, h2cClient(t), srv, s, records)
}

// TestHandedEgressH2C: the same conversation from a client whose egress
// rules restrict its connection: handed whole at its preface from the
// client's socket (or at the server's SETTINGS, arriving first), what
// the server sends steered into the slot by the client socket's skb
// verdict, every request judged by the proxy, the denied ones answered
// 403 on their streams.
func TestHandedEgressH2C(t *testing.T) {
	for _, first := range []bool{false, true} {
		t.Run(fmt.Sprintf("server first %v", first), func(t *testing.T) {
			srv, s, records, _ := handedSetupWith(t, handedOpts{rules: h2cRules, slots: 4, egress: true, h2First: first})
			dial := func() net.Conn {
				c, _ := dialRestricted(t, s, srv, [3]uint32{1})
				return c
			}
			checkH2C(t, h2cClientVia(t, dial), srv, s, records)
			for _, r := range *records {
				if !r.Handoff.Egress {
					t.Fatalf("record %+v: want the client's egress rules'", r)
				}
			}
		})
	}
}

// serveH2First serves each connection ln accepts with HTTP/2 alone, the
// server's SETTINGS sent at once.
func serveH2First(ln net.Listener, h http.Handler) {
	srv := &http2.Server{}
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go srv.ServeConn(c, &http2.ServeConnOpts{Handler: h})
	}
}

// checkH2C is TestHandedH2C's conversation and checks.
func checkH2C(t *testing.T, c *http.Client, srv *server, s *datapath.L7Sockets, records *[]Record) {
	t.Helper()
	base := "http://" + srv.addr
	reused := 0
	steps := []struct {
		method, path, body string
		header             map[string]string
		want               string
	}{
		{"GET", "/items/42", "", nil, "200 GET /items/42"},
		{"GET", "/secret", "", nil, "403 Access denied\n"},
		{"POST", "/v1/request-landing", "land", nil, "200 POST /v1/request-landing"},
		{"PUT", "/v1/exhaust-port", "boom", nil, "403 Access denied\n"},
		{"GET", "/team", "", map[string]string{"X-Team": "blue"}, "200 GET /team"},
		{"GET", "/team", "", map[string]string{"X-Team": "red"}, "403 Access denied\n"},
		{"GET", "/items/43", "", nil, "200 GET /items/43"},
	}
	for i, st := range steps {
		if got := call(t, c, st.method, base+st.path, st.body, st.header, &reused); got != st.want {
			t.Fatalf("step %d %s %s: got %q, want %q", i, st.method, st.path, got, st.want)
		}
	}
	if reused != len(steps)-1 {
		t.Fatalf("%d of %d requests reused the connection: a denial must not end it", reused, len(steps)-1)
	}

	// Streams at once on the same connection, allowed and denied mixed.
	var wg sync.WaitGroup
	errs := make(chan string, 40)
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path, want := fmt.Sprintf("/items/%d", i), fmt.Sprintf("200 GET /items/%d", i)
			if i%2 == 1 {
				path, want = fmt.Sprintf("/admin/%d", i), "403 Access denied\n"
			}
			if got := call(t, c, "GET", base+path, "", nil, nil); got != want {
				errs <- fmt.Sprintf("%s: got %q, want %q", path, got, want)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}

	// A gRPC-like bidirectional stream: each message comes back before
	// the next is sent, then the trailer.
	pr, pw := io.Pipe()
	req, _ := http.NewRequestWithContext(context.Background(), "POST", base+"/echo.Echo/Stream", pr)
	req.Header.Set("Content-Type", "application/grpc")
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(res.Body)
	for i := range 3 {
		fmt.Fprintf(pw, "ping%d\n", i)
		line, err := rd.ReadString('\n')
		if err != nil || line != fmt.Sprintf("echo ping%d\n", i) {
			t.Fatalf("stream message %d: %q, %v", i, line, err)
		}
	}
	pw.Close()
	if rest, _ := io.ReadAll(rd); len(rest) != 0 || res.Trailer.Get("Grpc-Status") != "0" {
		t.Fatalf("stream end: rest %q, trailer %v", rest, res.Trailer)
	}
	res.Body.Close()

	if list := srv.served(); strings.Contains(list, "secret") || strings.Contains(list, "admin") || strings.Contains(list, "exhaust") {
		t.Fatalf("a denied request reached the server:\n%s", list)
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.H2C != 1 || st.H2CServerBytes == 0 {
		t.Fatalf("counters %+v: want one h2c connection handed, its server's bytes through the proxy", st)
	}
	byPath := map[string]Record{}
	for _, r := range *records {
		if r.Request == nil {
			t.Fatalf("record without a request: %+v", r)
		}
		byPath[r.Request.Method+" "+r.Request.Target] = r
	}
	if len(*records) != len(steps)+40+1 {
		t.Fatalf("%d requests recorded, want %d", len(*records), len(steps)+41)
	}
	if r := byPath["GET /items/42"]; r.Decision.Verdict != Allow || r.Status != 200 || r.Request.Proto != l7.ProtoHTTP2 || r.Decision.Rule != 0 {
		t.Fatalf("allowed record %+v", r)
	}
	if r := byPath["PUT /v1/exhaust-port"]; r.Decision.Verdict != Deny || !r.Answered || r.Status != 0 {
		t.Fatalf("denied record %+v", r)
	}
}

// TestHandedH2CSlotsRecycle: h2c connections one after another, more
// than there are slots: each closes, its slot drains and serves the next;
// an HTTP/1 connection between them is read as before.
func TestHandedH2CSlotsRecycle(t *testing.T) {
	srv, s, _ := handedSetup(t, h2cRules, 2)
	base := "http://" + srv.addr
	for i := range 5 {
		c := h2cClient(t)
		if got := call(t, c, "GET", fmt.Sprintf("%s/items/%d", base, i), "", nil, nil); got != fmt.Sprintf("200 GET /items/%d", i) {
			t.Fatalf("connection %d: %q", i, got)
		}
		if got := call(t, c, "GET", base+"/secret", "", nil, nil); got != "403 Access denied\n" {
			t.Fatalf("connection %d: %q", i, got)
		}
		c.Transport.(*http.Transport).CloseIdleConnections()
		got := converse(t, dial(t, srv.addr), "GET /items/9 HTTP/1.1\r\nHost: h\r\n\r\n")
		if !strings.Contains(got[0], "GET /items/9") {
			t.Fatalf("HTTP/1 after h2c %d: %q", i, got)
		}
		time.Sleep(300 * time.Millisecond) // the slot sees the close
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.H2C != 5 {
		t.Fatalf("%d h2c connections handed, want 5", st.H2C)
	}
}

// TestH2CPrefaceLateRefused: the HTTP/2 preface after HTTP/1 bytes, or
// cut short at the connection's start, is read as an HTTP/1 request,
// whose version is refused: the connection ends (answered 400 where the
// answer fits in place) and nothing after it reaches the server.
func TestH2CPrefaceLateRefused(t *testing.T) {
	srv, _, _ := handedSetup(t, h2cRules, 2)
	got := converse(t, dial(t, srv.addr), "GET /items/1 HTTP/1.1\r\nHost: h\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "GET /items/2 HTTP/1.1\r\nHost: h\r\n\r\n")
	if !strings.Contains(got[0], "GET /items/1") || got[1] != "" && !strings.HasPrefix(got[1], "HTTP/1.1 400 ") || strings.Contains(got[2], "200") {
		t.Fatalf("late preface: %q", got)
	}
	got = converse(t, dial(t, srv.addr), "PRI * HTTP/2.0\r\n", "\r\nSM\r\n\r\n", "GET /items/3 HTTP/1.1\r\nHost: h\r\n\r\n")
	for i, g := range got {
		if strings.Contains(g, "200") {
			t.Fatalf("preface cut short, step %d served: %q", i, got)
		}
	}
	if list := srv.served(); list != "GET /items/1" {
		t.Fatalf("served %q, want only the first request", list)
	}
}

// TestH2CRawFrames: the smuggling corpus's h2c stream (the preface, then
// a HEADERS frame for /admin written by hand, no rule allowing it) at a
// connection's start, in one write and cut in two: the proxy reads the
// frame, answers 403 on its stream, and the server never serves it.
func TestH2CRawFrames(t *testing.T) {
	srv, _, _ := handedSetup(t, h2cRules, 4)
	var stream []byte
	for _, st := range testutil.SmugglingStreams(t) {
		if strings.HasPrefix(string(st), "PRI * HTTP/2.0") {
			stream = st
		}
	}
	if stream == nil {
		t.Fatal("no h2c stream in the smuggling corpus")
	}
	for _, at := range []int{len(stream), 24, 40} {
		c := dial(t, srv.addr)
		pieces := []string{string(stream[:at])}
		if at < len(stream) {
			pieces = append(pieces, string(stream[at:]))
		}
		for _, p := range pieces {
			if _, err := c.Write([]byte(p)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(30 * time.Millisecond)
		}
		if status := h2Status(t, c, 1); status != "403" {
			t.Fatalf("cut at %d: stream 1 answered %q, want 403", at, status)
		}
	}
	if list := srv.served(); strings.Contains(list, "/admin") {
		t.Fatalf("a smuggled request reached the server:\n%s", list)
	}
}

// h2Status reads frames from c until the HEADERS of stream id and returns
// its :status.
func h2Status(t *testing.T, c net.Conn, id uint32) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	fr := http2.NewFramer(c, c)
	dec := hpack.NewDecoder(4096, nil)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("read the answer's frames: %v", err)
		}
		if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
			fr.WriteSettingsAck()
		}
		h, ok := f.(*http2.HeadersFrame)
		if !ok || h.StreamID != id {
			continue
		}
		fields, err := dec.DecodeFull(h.HeaderBlockFragment())
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fields {
			if f.Name == ":status" {
				return f.Value
			}
		}
		return ""
	}
}

// TestHandedH2CFollowsPolicy: a policy change reaches a live h2c
// connection at its next request: what the new rules deny is answered
// 403 on the same connection, what they allow is served, and the records
// name the sets each request was judged against.
func TestHandedH2CFollowsPolicy(t *testing.T) {
	other := []l7.Rule{{Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/other"}}}
	srv, s, records, _ := handedSetupLimited(t, h2cRules, 2, Limits{}, other)
	c := h2cClient(t)
	base := "http://" + srv.addr
	reused := 0
	if got := call(t, c, "GET", base+"/items/42", "", nil, &reused); got != "200 GET /items/42" {
		t.Fatalf("before the change: %q", got)
	}
	_, port, _ := net.SplitHostPort(srv.addr)
	var p uint16
	fmt.Sscan(port, &p)
	if err := s.EnforceHTTP(p, 2); err != nil {
		t.Fatal(err)
	}
	if got := call(t, c, "GET", base+"/items/43", "", nil, &reused); got != "403 Access denied\n" {
		t.Fatalf("after the change, what it denies: %q", got)
	}
	if got := call(t, c, "GET", base+"/other/page", "", nil, &reused); got != "200 GET /other/page" {
		t.Fatalf("after the change, what it allows: %q", got)
	}
	if reused != 2 {
		t.Fatalf("%d of 2 requests after the first reused the connection", reused)
	}
	if strings.Contains(srv.served(), "/items/43") {
		t.Fatal("a request the new rules deny reached the server")
	}
	rs := *records
	if len(rs) != 3 || rs[0].Sets != [3]uint32{1} || rs[1].Sets != [3]uint32{2} || rs[2].Sets != [3]uint32{2} || rs[2].Decision.Set != 2 {
		t.Fatalf("records %+v: want set 1, then set 2 twice", rs)
	}
}

// TestH2CDeniedAnswerEndsCleanly: a denied request whose body is still
// coming is answered 403 and its stream ends with the client's last
// DATA, not with a reset some clients take for a failure (curl 7.88 did,
// one answer in seven); the connection goes on. A body that never ends
// is reset once the proxy stops waiting for it, and the connection still
// goes on.
func TestH2CDeniedAnswerEndsCleanly(t *testing.T) {
	srv, _, _ := handedSetup(t, h2cRules, 4)
	c := dial(t, srv.addr)
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	h := &rawH2{t: t, fr: http2.NewFramer(c, c), dec: hpack.NewDecoder(4096, nil)}
	h.enc = hpack.NewEncoder(&h.block)
	if err := h.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))

	h.request(1, "PUT", "/v1/exhaust-port", false)
	h.until("H1 403")
	if err := h.fr.WriteData(1, true, []byte("boom")); err != nil {
		t.Fatal(err)
	}
	h.request(3, "GET", "/items/42", true)
	if got := h.until("D3 end"); strings.Contains(got, "R1") || !strings.Contains(got, "D1 end") || !strings.Contains(got, "H3 200") {
		t.Fatalf("after the denied request's body ended: %s, want stream 1's answer ended, no reset of it, stream 3 served", got)
	}

	began := time.Now()
	h.request(5, "PUT", "/v1/exhaust-port", false)
	if got := h.until("R5"); !strings.Contains(got, "H5 403") {
		t.Fatalf("a denied request whose body never ends: %s", got)
	}
	if took := time.Since(began); took < h2DrainTime {
		t.Fatalf("stream 5 reset after %v, before the proxy's %v wait for its body", took, h2DrainTime)
	}
	h.request(7, "GET", "/items/7", true)
	if got := h.until("D7 end"); !strings.Contains(got, "H7 200") {
		t.Fatalf("after a reset stream: %s", got)
	}
}

// rawH2 is a client writing and reading HTTP/2 frames by hand.
type rawH2 struct {
	t     *testing.T
	fr    *http2.Framer
	enc   *hpack.Encoder
	block bytes.Buffer
	dec   *hpack.Decoder
}

// request opens stream id with a request head, its body to follow
// unless end.
func (h *rawH2) request(id uint32, method, path string, end bool) {
	h.t.Helper()
	h.block.Reset()
	for _, f := range [][2]string{{":method", method}, {":scheme", "http"}, {":authority", "weir.test"}, {":path", path}} {
		h.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.block.Bytes(), EndHeaders: true, EndStream: end}); err != nil {
		h.t.Fatal(err)
	}
}

// until reads frames until one described as want ("H<id> <status>",
// "D<id> end", "R<id>") and returns every frame's description, in order.
func (h *rawH2) until(want string) string {
	h.t.Helper()
	var seen []string
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			h.t.Fatalf("after %v: %v", seen, err)
		}
		var d string
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				h.fr.WriteSettingsAck()
			}
			continue
		case *http2.HeadersFrame:
			fields, err := h.dec.DecodeFull(f.HeaderBlockFragment())
			if err != nil {
				h.t.Fatal(err)
			}
			d = fmt.Sprintf("H%d %s", f.StreamID, fields[0].Value)
			if f.StreamEnded() {
				d += " end"
			}
		case *http2.DataFrame:
			d = fmt.Sprintf("D%d", f.StreamID)
			if f.StreamEnded() {
				d += " end"
			}
		case *http2.RSTStreamFrame:
			d = fmt.Sprintf("R%d %v", f.StreamID, f.ErrCode)
		default:
			continue
		}
		seen = append(seen, d)
		if strings.HasPrefix(d, want) {
			return strings.Join(seen, ", ")
		}
	}
}

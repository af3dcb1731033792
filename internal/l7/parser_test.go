package l7

import (
	"errors"
	"strings"
	"testing"
)

// feedAll feeds s whole and returns what the parser made of it.
func feedAll(t *testing.T, s string) ([]*Request, error) {
	t.Helper()
	return NewParser(Limits{}).Feed([]byte(s))
}

func TestParserReadsRequests(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want []Request // compared field by field below
	}{
		{
			name: "one GET",
			in:   "GET /a/b?x=1 HTTP/1.1\r\nHost: Example.COM:8080\r\nAccept: */*\r\n\r\n",
			want: []Request{{Method: "GET", Path: "/a/b", Query: "x=1", Host: "example.com", Proto: "HTTP/1.1"}},
		},
		{
			name: "keep-alive pipeline with a body between",
			in: "POST /v1/request-landing HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 5\r\n\r\nhello" +
				"PUT /v1/exhaust-port HTTP/1.1\r\nHost: deathstar\r\n\r\n",
			want: []Request{
				{Method: "POST", Path: "/v1/request-landing", Host: "deathstar", Proto: "HTTP/1.1", ContentLength: 5},
				{Method: "PUT", Path: "/v1/exhaust-port", Host: "deathstar", Proto: "HTTP/1.1"},
			},
		},
		{
			name: "chunked body with extension and trailer, then a request",
			in: "POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n" +
				"5;name=\"v\"\r\nhello\r\n10\r\n0123456789abcdef\r\n0\r\nX-Sum: 1\r\n\r\n" +
				"GET /next HTTP/1.1\r\nHost: h\r\n\r\n",
			want: []Request{
				{Method: "POST", Path: "/up", Host: "h", Proto: "HTTP/1.1", Chunked: true},
				{Method: "GET", Path: "/next", Host: "h", Proto: "HTTP/1.1"},
			},
		},
		{
			name: "blank lines before a request line are skipped",
			in:   "\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n",
			want: []Request{{Method: "GET", Path: "/", Host: "h", Proto: "HTTP/1.1"}},
		},
		{
			name: "absolute target agreeing with Host",
			in:   "GET http://API.example.com:80?q HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
			want: []Request{{Method: "GET", Path: "/", Query: "q", Host: "api.example.com", Proto: "HTTP/1.1"}},
		},
		{
			name: "canonical path: escapes uppercased, parameters cut",
			in:   "GET /api/v1;jsessionid=1/%c3%a9 HTTP/1.1\r\nHost: h\r\n\r\n",
			want: []Request{{Method: "GET", Path: "/api/v1/%C3%A9", Host: "h", Proto: "HTTP/1.1"}},
		},
		{
			name: "a body on POST, DELETE without one",
			in:   "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\r\nxDELETE /a HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n",
			want: []Request{
				{Method: "POST", Path: "/a", Host: "h", Proto: "HTTP/1.1", ContentLength: 1},
				{Method: "DELETE", Path: "/a", Host: "h", Proto: "HTTP/1.1"},
			},
		},
		{
			name: "HTTP/1.0 without Host closes",
			in:   "GET / HTTP/1.0\r\n\r\n",
			want: []Request{{Method: "GET", Path: "/", Proto: "HTTP/1.0", Close: true}},
		},
		{
			name: "OPTIONS * and CONNECT",
			in:   "OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\nCONNECT db.internal:5432 HTTP/1.1\r\nHost: db.internal:5432\r\n\r\n",
			want: []Request{
				{Method: "OPTIONS", Host: "h", Proto: "HTTP/1.1"},
				{Method: "CONNECT", Host: "db.internal", Proto: "HTTP/1.1", Upgrade: true},
			},
		},
		{
			name: "websocket upgrade",
			in:   "GET /ws HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n",
			want: []Request{{Method: "GET", Path: "/ws", Host: "h", Proto: "HTTP/1.1", Upgrade: true}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := feedAll(t, tc.in)
			if err != nil {
				t.Fatalf("Feed: %v", err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d requests, want %d", len(got), len(tc.want))
			}
			for i, w := range tc.want {
				g := got[i]
				if g.Method != w.Method || g.Path != w.Path || g.Query != w.Query || g.Host != w.Host ||
					g.Proto != w.Proto || g.ContentLength != w.ContentLength || g.Chunked != w.Chunked ||
					g.Close != w.Close || g.Upgrade != w.Upgrade {
					t.Errorf("request %d = %+v, want %+v", i, *g, w)
				}
			}
		})
	}
}

func TestParserRefuses(t *testing.T) {
	const host = "Host: h\r\n"
	for _, tc := range []struct {
		name string
		in   string
		want error
	}{
		{"bare LF ending a line", "GET / HTTP/1.1\n" + host + "\r\n", ErrMalformed},
		{"bare CR inside a value", "GET / HTTP/1.1\r\nX: a\rb\r\n" + host + "\r\n", ErrMalformed},
		{"obs-fold", "GET / HTTP/1.1\r\n" + host + "X: a\r\n b\r\n\r\n", ErrMalformed},
		{"space before colon", "GET / HTTP/1.1\r\n" + host + "Content-Length : 3\r\n\r\nabc", ErrMalformed},
		{"two spaces in request line", "GET  / HTTP/1.1\r\n" + host + "\r\n", ErrMalformed},
		{"NUL in a value", "GET / HTTP/1.1\r\n" + host + "X: a\x00b\r\n\r\n", ErrMalformed},
		{"HTTP/2.0 request line", "GET / HTTP/2.0\r\n" + host + "\r\n", ErrUnsupportedVersion},
		{"HTTP/0.9", "GET /\r\n\r\n", ErrMalformed},
		{"CL and TE", "POST / HTTP/1.1\r\n" + host + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n", ErrAmbiguousFraming},
		{"two CLs, even equal", "POST / HTTP/1.1\r\n" + host + "Content-Length: 4\r\nContent-Length: 4\r\n\r\n", ErrAmbiguousFraming},
		{"CL list", "POST / HTTP/1.1\r\n" + host + "Content-Length: 4, 4\r\n\r\n", ErrAmbiguousFraming},
		{"CL with sign", "POST / HTTP/1.1\r\n" + host + "Content-Length: +4\r\n\r\n", ErrAmbiguousFraming},
		{"CL overflow", "POST / HTTP/1.1\r\n" + host + "Content-Length: 99999999999999999999\r\n\r\n", ErrAmbiguousFraming},
		{"TE not ending in chunked", "POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked, gzip\r\n\r\n", ErrAmbiguousFraming},
		{"TE xchunked", "POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: xchunked\r\n\r\n", ErrAmbiguousFraming},
		{"TE chunked twice", "POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", ErrAmbiguousFraming},
		{"TE in HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", ErrAmbiguousFraming},
		{"chunk size 0x", "POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n", ErrAmbiguousFraming},
		{"chunk size with space", "POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n", ErrAmbiguousFraming},
		{"chunk longer than its size", "POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n", ErrAmbiguousFraming},
		{"chunk size of 16 digits", "POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\n\r\n1000000000000000\r\n", ErrAmbiguousFraming},
		{"no Host in HTTP/1.1", "GET / HTTP/1.1\r\n\r\n", ErrAmbiguousTarget},
		{"two Hosts", "GET / HTTP/1.1\r\n" + host + host + "\r\n", ErrAmbiguousTarget},
		{"absolute target disagrees with Host", "GET http://a/ HTTP/1.1\r\nHost: b\r\n\r\n", ErrAmbiguousTarget},
		{"userinfo", "GET http://a@b/ HTTP/1.1\r\nHost: b\r\n\r\n", ErrAmbiguousTarget},
		{"dot-dot segment", "GET /public/../admin HTTP/1.1\r\n" + host + "\r\n", ErrAmbiguousTarget},
		{"encoded dot-dot", "GET /public/%2e%2E/admin HTTP/1.1\r\n" + host + "\r\n", ErrAmbiguousTarget},
		{"dot-dot with parameters", "GET /public/..;/admin HTTP/1.1\r\n" + host + "\r\n", ErrAmbiguousTarget},
		{"encoded slash", "GET /public%2Fadmin HTTP/1.1\r\n" + host + "\r\n", ErrAmbiguousTarget},
		{"empty segment", "GET //admin HTTP/1.1\r\n" + host + "\r\n", ErrAmbiguousTarget},
		{"bad percent-encoding", "GET /a%zz HTTP/1.1\r\n" + host + "\r\n", ErrAmbiguousTarget},
		{"encoded unreserved", "GET /%61dmin HTTP/1.1\r\n" + host + "\r\n", ErrAmbiguousTarget},
		{"encoded slash in parameters", "GET /public;%2F..%2Fadmin HTTP/1.1\r\n" + host + "\r\n", ErrAmbiguousTarget},
		{"bad escape in parameters", "GET /public;%zz HTTP/1.1\r\n" + host + "\r\n", ErrAmbiguousTarget},
		{"GET with a body", "GET /public HTTP/1.1\r\n" + host + "Content-Length: 3\r\n\r\nabc", ErrAmbiguousFraming},
		{"HEAD chunked", "HEAD /public HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", ErrAmbiguousFraming},
		{"method override", "POST /public HTTP/1.1\r\n" + host + "X-HTTP-Method-Override: PUT\r\nContent-Length: 0\r\n\r\n", ErrAmbiguousTarget},
		{"URL override", "GET /public HTTP/1.1\r\n" + host + "X-Original-URL: /admin\r\n\r\n", ErrAmbiguousTarget},
		{"backslash", "GET /public\\..\\admin HTTP/1.1\r\n" + host + "\r\n", ErrMalformed},
		{"fragment", "GET /a#b HTTP/1.1\r\n" + host + "\r\n", ErrMalformed},
		{"non-ASCII target", "GET /\xc3\xa9 HTTP/1.1\r\n" + host + "\r\n", ErrMalformed},
		{"asterisk with GET", "GET * HTTP/1.1\r\n" + host + "\r\n", ErrMalformed},
		{"head too large", "GET / HTTP/1.1\r\n" + host + "X: " + strings.Repeat("a", 17<<10) + "\r\n\r\n", ErrHeadTooLarge},
		{"too many fields", "GET / HTTP/1.1\r\n" + host + strings.Repeat("X: a\r\n", 100) + "\r\n", ErrHeadTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := feedAll(t, tc.in)
			var re *RequestError
			if !errors.As(err, &re) || !errors.Is(err, tc.want) {
				t.Fatalf("Feed: %v, want a RequestError wrapping %v", err, tc.want)
			}
			if re.Status != 400 {
				t.Errorf("status %d, want 400", re.Status)
			}
		})
	}
}

// TestParserNamesHTTP2: the h2c connection preface is refused with a
// reason that says what it is, so a gRPC client's closed connection is
// explained in its record.
func TestParserNamesHTTP2(t *testing.T) {
	_, err := feedAll(t, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	var re *RequestError
	if !errors.As(err, &re) || !errors.Is(err, ErrUnsupportedVersion) || re.Status != 400 {
		t.Fatalf("Feed: %v, want a 400 RequestError wrapping %v", err, ErrUnsupportedVersion)
	}
	if !strings.Contains(re.Reason, "h2c") {
		t.Errorf("reason %q does not name HTTP/2 over cleartext (h2c)", re.Reason)
	}
}

func TestParserRefusesEverythingAfterARefusal(t *testing.T) {
	p := NewParser(Limits{})
	if _, err := p.Feed([]byte("GET / HTTP/1.1\n")); err == nil {
		t.Fatal("bare LF accepted")
	}
	reqs, err := p.Feed([]byte("GET / HTTP/1.1\r\nHost: h\r\n\r\n"))
	if len(reqs) != 0 || !errors.Is(err, ErrMalformed) {
		t.Fatalf("after a refusal: %d requests, %v; want none and the first error", len(reqs), err)
	}
}

func TestParserRefusesRepeatedRuleHeaders(t *testing.T) {
	p := NewParser(Limits{})
	p.RefuseRepeated([]string{"X-Role"})
	in := "GET / HTTP/1.1\r\nHost: h\r\nAccept: a\r\nAccept: b\r\nx-role: user\r\nX-Role: admin\r\n\r\n"
	if _, err := p.Feed([]byte(in)); !errors.Is(err, ErrAmbiguousHeader) {
		t.Fatalf("Feed: %v, want ErrAmbiguousHeader", err)
	}
	if _, err := feedAll(t, in); err != nil {
		t.Fatalf("without RefuseRepeated: %v", err)
	}
}

// TestParserSplitAnywhere feeds every request of the table tests split at
// every byte: the kernel hands TCP segments over as they come, and a
// request must read the same however it was cut.
func TestParserSplitAnywhere(t *testing.T) {
	in := "\r\nPOST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"5;e=1\r\nhello\r\n0\r\nT: 1\r\n\r\n" +
		"PUT /b HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc" +
		"GET /c HTTP/1.1\r\nHost: h\r\n\r\n"
	whole, err := feedAll(t, in)
	if err != nil || len(whole) != 3 {
		t.Fatalf("whole: %d requests, %v", len(whole), err)
	}
	for cut := 1; cut < len(in); cut++ {
		p := NewParser(Limits{})
		a, err := p.Feed([]byte(in[:cut]))
		if err != nil {
			t.Fatalf("cut %d: first part: %v", cut, err)
		}
		b, err := p.Feed([]byte(in[cut:]))
		if err != nil {
			t.Fatalf("cut %d: second part: %v", cut, err)
		}
		got := append(a, b...)
		if len(got) != len(whole) {
			t.Fatalf("cut %d: %d requests, want %d", cut, len(got), len(whole))
		}
		for i := range got {
			if got[i].Start != whole[i].Start || got[i].Path != whole[i].Path || got[i].HeadLen != whole[i].HeadLen {
				t.Fatalf("cut %d: request %d = %+v, want %+v", cut, i, *got[i], *whole[i])
			}
		}
	}
}

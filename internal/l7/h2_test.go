package l7

import (
	"errors"
	"strings"
	"testing"
)

// TestHTTP2Request: an HTTP/2 head is read as an HTTP/1.1 head would be,
// and refused for the same reasons, CONNECT too.
func TestHTTP2Request(t *testing.T) {
	cases := []struct {
		name, method, path, authority string
		fields                        []Field
		repeated                      []string
		want                          error // nil: read
		host, canon, query            string
	}{
		{name: "plain", method: "GET", path: "/a/b?x=1", authority: "Example.COM:8080", host: "example.com", canon: "/a/b", query: "x=1"},
		{name: "grpc", method: "POST", path: "/pkg.Svc/Call", authority: "svc", fields: []Field{{"content-type", "application/grpc"}, {"te", "trailers"}}, host: "svc", canon: "/pkg.Svc/Call"},
		{name: "escapes canonical", method: "GET", path: "/a%2fb", authority: "h", want: ErrAmbiguousTarget},
		{name: "dot segment", method: "GET", path: "/public/../admin", authority: "h", want: ErrAmbiguousTarget},
		{name: "empty segment", method: "GET", path: "//admin", authority: "h", want: ErrAmbiguousTarget},
		{name: "parameters cut", method: "GET", path: "/public;x/a", authority: "h", host: "h", canon: "/public/a"},
		{name: "absolute path form", method: "GET", path: "http://h/admin", authority: "h", want: ErrMalformed},
		{name: "asterisk", method: "OPTIONS", path: "*", authority: "h", host: "h"},
		{name: "asterisk with GET", method: "GET", path: "*", authority: "h", want: ErrMalformed},
		{name: "connect", method: "CONNECT", path: "", authority: "h:443", want: ErrUnsupportedVersion},
		{name: "method not a token", method: "GE T", path: "/", authority: "h", want: ErrMalformed},
		{name: "override", method: "POST", path: "/public", authority: "h", fields: []Field{{"x-http-method-override", "DELETE"}}, want: ErrAmbiguousTarget},
		{name: "host disagrees", method: "GET", path: "/", authority: "a", fields: []Field{{"host", "b"}}, want: ErrAmbiguousTarget},
		{name: "two hosts", method: "GET", path: "/", authority: "", fields: []Field{{"host", "a"}, {"host", "a"}}, want: ErrAmbiguousTarget},
		{name: "host field alone", method: "GET", path: "/", authority: "", fields: []Field{{"host", "B."}}, host: "b", canon: "/"},
		{name: "no host", method: "GET", path: "/", authority: "", host: "", canon: "/"},
		{name: "authority with user", method: "GET", path: "/", authority: "u@h", want: ErrAmbiguousTarget},
		{name: "repeated rule header", method: "GET", path: "/", authority: "h", fields: []Field{{"x-team", "blue"}, {"x-team", "red"}}, repeated: []string{"x-team"}, want: ErrAmbiguousHeader},
		{name: "repeated other header", method: "GET", path: "/", authority: "h", fields: []Field{{"x-a", "1"}, {"x-a", "2"}}, repeated: []string{"x-team"}, host: "h", canon: "/"},
		{name: "control byte", method: "GET", path: "/", authority: "h", fields: []Field{{"x-a", "1\x01"}}, want: ErrMalformed},
		{name: "uppercase name", method: "GET", path: "/", authority: "h", fields: []Field{{"X-A", "1"}}, want: ErrMalformed},
		{name: "space in path", method: "GET", path: "/a b", authority: "h", want: ErrMalformed},
	}
	for _, c := range cases {
		r, err := HTTP2Request(c.method, c.path, c.authority, c.fields, c.repeated)
		if c.want != nil {
			if err == nil || !errors.Is(err, c.want) || err.Status != 400 {
				t.Errorf("%s: got %+v, %v; want refused with %v", c.name, r, err, c.want)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: refused: %v", c.name, err)
			continue
		}
		if r.Host != c.host || r.Path != c.canon || r.Query != c.query || r.Proto != ProtoHTTP2 || r.Target != c.path {
			t.Errorf("%s: got host %q path %q query %q proto %q target %q", c.name, r.Host, r.Path, r.Query, r.Proto, r.Target)
		}
	}
}

// TestHTTP2RequestAgreesWithParser: every HTTP/1.1 request of the
// smuggling corpus's shapes, put as an HTTP/2 head, reads the same (path,
// host, query) or is refused the same.
func TestHTTP2RequestAgreesWithParser(t *testing.T) {
	targets := []string{"/", "/public", "/public/a?x", "/PUBLIC/%7e", "/a%2Fb", "/%70ublic", "/..;/admin", "/public;jsessionid=1/a",
		"/a//b", "/%c0%ae", "/a\\b", "/ok/%41", "/x?y=%2e%2e", "/public/%2e%2e/admin"}
	hosts := []string{"h", "H.example.", "h:80", "[::1]:8080", "a..b", "h%41"}
	for _, target := range targets {
		for _, host := range hosts {
			p := NewParser(Limits{})
			reqs, perr := p.Feed([]byte("GET " + target + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n"))
			r2, err2 := HTTP2Request("GET", target, host, nil, nil)
			if (perr == nil) != (err2 == nil) {
				t.Errorf("GET %s Host %s: HTTP/1 %v, HTTP/2 %v", target, host, perr, err2)
				continue
			}
			if perr != nil {
				continue
			}
			r1 := reqs[0]
			if r1.Path != r2.Path || r1.Host != r2.Host || r1.Query != r2.Query {
				t.Errorf("GET %s Host %s: HTTP/1 %q %q %q, HTTP/2 %q %q %q", target, host, r1.Path, r1.Host, r1.Query, r2.Path, r2.Host, r2.Query)
			}
		}
	}
}

// FuzzHTTP2Request holds the HTTP/2 head reader to the HTTP/1.1 parser on
// any method, target and authority: where an HTTP/1.1 request line and
// Host field can carry them, both read them alike (the same path, host
// and query) or both refuse; and whatever it accepts is already in the
// form rules match (a canonical path and host). CI runs it as a smoke
// test (hack/test.sh).
func FuzzHTTP2Request(f *testing.F) {
	for _, s := range [][3]string{{"GET", "/", "h"}, {"POST", "/pkg.Svc/Call", "svc:50051"}, {"GET", "/a/../b", "h"},
		{"GET", "/a%2fb?x", "H."}, {"OPTIONS", "*", "h"}, {"GET", "//x", "[::1]:80"}, {"PUT", "/v1/exhaust-port", "u@h"}} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, method, path, authority string) {
		r, err := HTTP2Request(method, path, authority, nil, nil)
		if err == nil {
			if canon, cerr := CanonicalPath(r.Path); r.Path != "" && (cerr != nil || canon != r.Path) {
				t.Fatalf("accepted path %q is not canonical (%q, %v)", r.Path, canon, cerr)
			}
			if host, herr := canonicalHost(r.Host); herr != nil || host != r.Host {
				t.Fatalf("accepted host %q is not canonical (%q, %v)", r.Host, host, herr)
			}
		}
		// Only what one request line and one Host field can carry.
		if authority == "" || method == "CONNECT" || strings.ContainsAny(method+path+authority, " \r\n\t") || !strings.HasPrefix(path, "/") && path != "*" {
			return
		}
		reqs, perr := NewParser(Limits{}).Feed([]byte(method + " " + path + " HTTP/1.1\r\nHost: " + authority + "\r\n\r\n"))
		if perr == nil && len(reqs) != 1 {
			return // a head the HTTP/1 parser reads in part (a body follows): not comparable
		}
		if (perr == nil) != (err == nil) {
			t.Fatalf("%s %q at %q: HTTP/1.1 %v, HTTP/2 %v", method, path, authority, perr, err)
		}
		if err == nil && (reqs[0].Path != r.Path || reqs[0].Host != r.Host || reqs[0].Query != r.Query) {
			t.Fatalf("%s %q at %q: HTTP/1.1 read %q %q %q, HTTP/2 %q %q %q", method, path, authority,
				reqs[0].Path, reqs[0].Host, reqs[0].Query, r.Path, r.Host, r.Query)
		}
	})
}

package l7

import (
	"bytes"
	"strings"
)

// Request is one request head as the parser read it.
type Request struct {
	// Start is the stream offset of the request line's first byte, and
	// HeadLen the head's length up to and including its blank line.
	Start   int64
	HeadLen int
	Method  string
	// Target is the request-target as sent.
	Target string
	// Path is the target's path in canonical form (CanonicalPath), the
	// form rules match; "" for the asterisk and authority forms.
	Path string
	// Query is the target's query, without its '?', as sent.
	Query string
	// Host is the request's host: lowercase, without port or trailing
	// dot; "" when the request names none (HTTP/1.0, an empty Host).
	Host  string
	Proto string // "HTTP/1.1" or "HTTP/1.0"
	// Header holds the fields in order, names lowercase, values trimmed.
	Header []Field
	// ContentLength is the body's length when it has one; Chunked says
	// its length is in its chunks.
	ContentLength int64
	Chunked       bool
	// Close says the client asked the server to close after answering.
	Close bool
	// Upgrade says the request asks to leave HTTP/1.1 on this connection
	// (an Upgrade header named in Connection, or CONNECT).
	Upgrade bool
}

// Field is one header field.
type Field struct {
	Name, Value string
}

// Values returns the values of every field with this (lowercase) name.
func (r *Request) Values(name string) []string {
	var vs []string
	for _, f := range r.Header {
		if f.Name == name {
			vs = append(vs, f.Value)
		}
	}
	return vs
}

// parseHead reads a whole head: request line, fields, blank line.
func parseHead(head []byte, start int64, l Limits, refuseRepeated map[string]bool) (*Request, *RequestError) {
	r := &Request{Start: start, HeadLen: len(head)}
	lines := bytes.Split(head[:len(head)-4], []byte("\r\n"))
	if err := r.parseRequestLine(lines[0], start); err != nil {
		return nil, err
	}
	at := start + int64(len(lines[0])) + 2
	if len(lines)-1 > l.MaxHeaders {
		return nil, refuse(ErrHeadTooLarge, at, "more than %d header fields", l.MaxHeaders)
	}
	for _, line := range lines[1:] {
		name, value, err := parseField(line, at)
		if err != nil {
			return nil, err
		}
		r.Header = append(r.Header, Field{Name: name, Value: value})
		at += int64(len(line)) + 2
	}
	if err := r.readFraming(start); err != nil {
		return nil, err
	}
	if (r.Chunked || r.ContentLength > 0) && bodylessMethods[r.Method] {
		// A server that does not read a GET's body (Python's
		// http.server does not) reads it as the next request.
		return nil, refuse(ErrAmbiguousFraming, start, "a body on a %s request", r.Method)
	}
	for _, f := range r.Header {
		if overrideHeaders[f.Name] {
			return nil, refuse(ErrAmbiguousTarget, start, "%s asks the application for another method or target than the rules read", f.Name)
		}
	}
	if err := r.readHost(start); err != nil {
		return nil, err
	}
	r.readConnection()
	for name := range refuseRepeated {
		if len(r.Values(name)) > 1 {
			return nil, refuse(ErrAmbiguousHeader, start, "%s sent %d times", name, len(r.Values(name)))
		}
	}
	return r, nil
}

// bodylessMethods are the methods whose body has no defined meaning
// (RFC 9110): a request of one with a body is refused, since servers
// that ignore such a body take it for the next request.
var bodylessMethods = map[string]bool{"GET": true, "HEAD": true, "DELETE": true, "OPTIONS": true, "TRACE": true}

// overrideHeaders make frameworks (Express's method-override, Spring,
// Laravel, Symfony, IIS) act on another method or target than the
// request line's, which the rules read: refused.
var overrideHeaders = map[string]bool{
	"x-http-method-override": true, "x-http-method": true, "x-method-override": true,
	"x-original-url": true, "x-rewrite-url": true,
}

// parseRequestLine reads "method SP request-target SP HTTP-version", one
// space each.
func (r *Request) parseRequestLine(line []byte, start int64) *RequestError {
	parts := bytes.Split(line, []byte(" "))
	if len(parts) != 3 {
		return refuse(ErrMalformed, start, "request line is not three fields separated by single spaces")
	}
	method, target, version := parts[0], parts[1], parts[2]
	if !isToken(method) {
		return refuse(ErrMalformed, start, "method is not a token")
	}
	r.Method = string(method)
	switch string(version) {
	case "HTTP/1.1", "HTTP/1.0":
		r.Proto = string(version)
	default:
		if string(version) == "HTTP/2.0" {
			// The connection preface of HTTP/2 over cleartext (h2c with
			// prior knowledge, as gRPC clients open it). A connection
			// that opens with it is handed whole to the proxy, which
			// speaks HTTP/2 (HTTP2Request); here it came after HTTP/1
			// bytes, or cut short, and no server reads it so.
			return refuse(ErrUnsupportedVersion, start, "HTTP/2 (h2c) preface not at the connection's start in one piece")
		}
		if bytes.HasPrefix(version, []byte("HTTP/")) {
			return refuse(ErrUnsupportedVersion, start, "version %q", version)
		}
		return refuse(ErrMalformed, start, "no HTTP version at the request line's end")
	}
	return r.parseTarget(string(target), start+int64(len(method))+1)
}

// parseField reads "name:" OWS value OWS. Whitespace before the colon, a
// line that starts with whitespace (obs-fold) and control bytes in the
// value are refused.
func parseField(line []byte, at int64) (string, string, *RequestError) {
	if len(line) > 0 && (line[0] == ' ' || line[0] == '\t') {
		return "", "", refuse(ErrMalformed, at, "obs-fold (a field line that starts with whitespace)")
	}
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 {
		return "", "", refuse(ErrMalformed, at, "field line without a name and a colon")
	}
	if !isToken(line[:colon]) {
		return "", "", refuse(ErrMalformed, at, "field name %q is not a token (whitespace before the colon?)", line[:colon])
	}
	value := bytes.Trim(line[colon+1:], " \t")
	for i, c := range value {
		if !isFieldValueByte(c) {
			return "", "", refuse(ErrMalformed, at+int64(colon+1+i), "control byte 0x%02x in field %s", c, line[:colon])
		}
	}
	return lower(string(line[:colon])), string(value), nil
}

// readFraming sets the body's length from Content-Length and
// Transfer-Encoding, refusing every combination readers disagree on.
func (r *Request) readFraming(start int64) *RequestError {
	cls := r.Values("content-length")
	tes := r.Values("transfer-encoding")
	if len(tes) > 0 {
		if len(cls) > 0 {
			return refuse(ErrAmbiguousFraming, start, "both Content-Length and Transfer-Encoding")
		}
		if r.Proto == "HTTP/1.0" {
			return refuse(ErrAmbiguousFraming, start, "Transfer-Encoding in an HTTP/1.0 request")
		}
		codings := strings.Split(strings.Join(tes, ","), ",")
		for i, c := range codings {
			c = lower(strings.Trim(c, " \t"))
			if c == "" || !isToken([]byte(c)) {
				return refuse(ErrAmbiguousFraming, start, "transfer coding %q is not a token", c)
			}
			if (c == "chunked") != (i == len(codings)-1) {
				return refuse(ErrAmbiguousFraming, start, "chunked is not the last transfer coding, once")
			}
		}
		r.Chunked = true
		return nil
	}
	switch len(cls) {
	case 0:
		return nil
	case 1:
	default:
		return refuse(ErrAmbiguousFraming, start, "%d Content-Length fields", len(cls))
	}
	v := cls[0]
	if v == "" || len(v) > 18 {
		return refuse(ErrAmbiguousFraming, start, "Content-Length %q is not 1 to 18 digits", v)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return refuse(ErrAmbiguousFraming, start, "Content-Length %q is not a number", v)
		}
		r.ContentLength = r.ContentLength*10 + int64(v[i]-'0')
	}
	return nil
}

// readHost takes the host from the one Host field (HTTP/1.1 requires
// exactly one) or from an absolute target, which must then agree with it.
func (r *Request) readHost(start int64) *RequestError {
	hosts := r.Values("host")
	if len(hosts) > 1 {
		return refuse(ErrAmbiguousTarget, start, "%d Host fields", len(hosts))
	}
	if len(hosts) == 0 {
		if r.Proto == "HTTP/1.1" {
			return refuse(ErrAmbiguousTarget, start, "HTTP/1.1 request without Host")
		}
		return nil
	}
	host, err := canonicalHost(hosts[0])
	if err != nil {
		return refuse(ErrAmbiguousTarget, start, "Host %q: %v", hosts[0], err)
	}
	if r.Host != "" && host != r.Host {
		return refuse(ErrAmbiguousTarget, start, "Host %q disagrees with the target's %q", host, r.Host)
	}
	r.Host = host
	return nil
}

func (r *Request) readConnection() {
	opts := map[string]bool{}
	for _, v := range r.Values("connection") {
		for _, o := range strings.Split(v, ",") {
			opts[lower(strings.Trim(o, " \t"))] = true
		}
	}
	r.Close = opts["close"] || (r.Proto == "HTTP/1.0" && !opts["keep-alive"])
	r.Upgrade = r.Method == "CONNECT" || (opts["upgrade"] && len(r.Values("upgrade")) > 0)
}

func lower(s string) string { return strings.ToLower(s) }

func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !isTokenByte(c) {
			return false
		}
	}
	return true
}

func isTokenByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// isFieldValueByte is VCHAR, SP, HTAB or obs-text.
func isFieldValueByte(c byte) bool {
	return c == '\t' || (c >= 0x20 && c != 0x7f)
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

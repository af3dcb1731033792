package l7

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// parseTarget reads the request-target in the form its method allows:
// origin ("/p?q"), absolute ("http://host/p?q"), authority (CONNECT
// only) or asterisk (OPTIONS only).
func (r *Request) parseTarget(t string, at int64) *RequestError {
	r.Target = t
	for i := 0; i < len(t); i++ {
		if !isTargetByte(t[i]) {
			return refuse(ErrMalformed, at+int64(i), "byte %q not allowed in a request target (encode it)", t[i])
		}
	}
	switch {
	case r.Method == "CONNECT":
		host, err := canonicalHost(t)
		if err != nil || !strings.Contains(t, ":") {
			return refuse(ErrMalformed, at, "CONNECT target %q is not host:port", t)
		}
		r.Host = host
		return nil
	case t == "*":
		if r.Method != "OPTIONS" {
			return refuse(ErrMalformed, at, "asterisk target with %s", r.Method)
		}
		return nil
	case strings.HasPrefix(t, "/"):
	default:
		rest, ok := cutPrefixFold(t, "http://")
		if !ok {
			rest, ok = cutPrefixFold(t, "https://")
		}
		if !ok {
			return refuse(ErrMalformed, at, "target %q is neither /path nor http(s)://host/path", t)
		}
		end := strings.IndexAny(rest, "/?")
		if end < 0 {
			end = len(rest)
		}
		authority := rest[:end]
		if strings.Contains(authority, "@") {
			return refuse(ErrAmbiguousTarget, at, "user information in the target's authority")
		}
		host, err := canonicalHost(authority)
		if err != nil || host == "" {
			return refuse(ErrAmbiguousTarget, at, "target authority %q: %v", authority, err)
		}
		r.Host = host
		t = rest[end:]
		if t == "" || t[0] == '?' {
			t = "/" + t
		}
	}
	path, query, _ := strings.Cut(t, "?")
	r.Query = query
	canon, err := CanonicalPath(path)
	if err != nil {
		return refuse(ErrAmbiguousTarget, at, "%v", err)
	}
	r.Path = canon
	return nil
}

// ErrPathAmbiguous is a path CanonicalPath will not put in one form.
var ErrPathAmbiguous = errors.New("path servers may read differently")

// CanonicalPath puts an absolute path in the form rules match against:
// escapes in uppercase hex, each segment's parameters (from a ';' on,
// which Java servers strip) cut off. It refuses, with ErrPathAmbiguous,
// what servers resolve in different ways: "." and ".." segments (also
// with parameters, as in "/..;/"), an encoded '/', '\', NUL or
// unreserved character anywhere in a segment (its parameters too), an
// empty segment ("//", which nginx merges), a bad percent-encoding and
// escapes that are not UTF-8.
func CanonicalPath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("%w: %q does not start with '/'", ErrPathAmbiguous, p)
	}
	segs := strings.Split(p[1:], "/")
	var out strings.Builder
	for i, seg := range segs {
		if seg == "" && i != len(segs)-1 {
			return "", fmt.Errorf("%w: %q has an empty segment", ErrPathAmbiguous, p)
		}
		canon, err := canonicalSegment(seg)
		if err != nil {
			return "", fmt.Errorf("%w: %q: %v", ErrPathAmbiguous, p, err)
		}
		if canon == "." || canon == ".." {
			return "", fmt.Errorf("%w: %q has a dot segment", ErrPathAmbiguous, p)
		}
		// "/;x/" would be "//" once its parameters are cut: servers that
		// cut them and merge slashes read another path than those that
		// serve ";x" as a name.
		if canon == "" && seg != "" {
			return "", fmt.Errorf("%w: %q has a segment that is only parameters", ErrPathAmbiguous, p)
		}
		out.WriteByte('/')
		out.WriteString(canon)
	}
	return out.String(), nil
}

// canonicalSegment gives a segment's canonical form: escapes in
// uppercase hex, the parameters (from a ';' on) cut off. Every escape of
// the whole segment, parameters included, must be well formed and stand
// for a byte servers agree on: an encoded '/', '\' or NUL is refused (a
// server that decodes it before routing resolves another path: nginx
// takes "/public;%2F..%2Fadmin" to /admin), and so is an encoded
// unreserved character (RFC 3986 says never to encode one, and servers
// that route on the raw path and those that decode first disagree), and
// the bytes the escapes stand for must be UTF-8 (an overlong %c0%ae is a
// '.' to a lax decoder).
func canonicalSegment(seg string) (string, error) {
	var b strings.Builder
	var decoded []byte
	params := false
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if c == '[' || c == ']' {
			return "", fmt.Errorf("%q outside a host", c)
		}
		if c != '%' {
			decoded = append(decoded, c)
			params = params || c == ';'
			if !params {
				b.WriteByte(c)
			}
			continue
		}
		if i+2 >= len(seg) || !isHex(seg[i+1]) || !isHex(seg[i+2]) {
			return "", errors.New("bad percent-encoding")
		}
		d := unhex(seg[i+1])<<4 | unhex(seg[i+2])
		decoded = append(decoded, d)
		i += 2
		switch {
		case d == '/' || d == '\\' || d == 0:
			return "", fmt.Errorf("encoded %q", d)
		case isUnreserved(d):
			return "", fmt.Errorf("encoded %q, which is sent as it is", d)
		}
		if !params {
			fmt.Fprintf(&b, "%%%02X", d)
		}
	}
	if !utf8.Valid(decoded) {
		return "", errors.New("escapes that are not UTF-8")
	}
	return b.String(), nil
}

// canonicalHost reads "host[:port]": the host lowercased, without its
// port or a trailing dot. Hosts are names, IPv4 addresses or bracketed
// IPv6 literals; percent-encoding and user information are refused.
func canonicalHost(h string) (string, error) {
	if h == "" {
		return "", nil
	}
	host, port, err := splitHostPort(h)
	if err != nil {
		return "", err
	}
	for i := 0; i < len(port); i++ {
		if port[i] < '0' || port[i] > '9' {
			return "", errors.New("port is not a number")
		}
	}
	if strings.HasPrefix(host, "[") {
		for i := 1; i < len(host)-1; i++ {
			if !isHex(host[i]) && host[i] != ':' && host[i] != '.' {
				return "", errors.New("bad IPv6 literal")
			}
		}
		return lower(host), nil
	}
	for i := 0; i < len(host); i++ {
		if c := host[i]; !isUnreserved(c) || c == '~' {
			return "", fmt.Errorf("byte %q in a host name", c)
		}
	}
	if host == "" || host[0] == '.' || strings.Contains(host, "..") {
		return "", errors.New("empty label in a host name")
	}
	host = strings.TrimSuffix(host, ".")
	return lower(host), nil
}

func splitHostPort(h string) (host, port string, err error) {
	if strings.HasPrefix(h, "[") {
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return "", "", errors.New("unterminated IPv6 literal")
		}
		host, rest := h[:end+1], h[end+1:]
		if rest != "" && rest[0] != ':' {
			return "", "", errors.New("bytes after the IPv6 literal")
		}
		return host, strings.TrimPrefix(rest, ":"), nil
	}
	if i := strings.LastIndexByte(h, ':'); i >= 0 {
		return h[:i], h[i+1:], nil
	}
	return h, "", nil
}

func isUnreserved(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

// isTargetByte is what an origin or absolute target may hold: unreserved,
// sub-delims, ':', '@', '/', '?', '%' (and '[' ']' for an IPv6 host).
func isTargetByte(c byte) bool {
	return isUnreserved(c) || strings.IndexByte("!$&'()*+,;=:@/?%[]", c) >= 0
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix) {
		return s[len(prefix):], true
	}
	return "", false
}

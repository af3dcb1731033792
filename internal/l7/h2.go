package l7

import "strings"

// ProtoHTTP2 is the Proto of a request read from HTTP/2 frames.
const ProtoHTTP2 = "HTTP/2.0"

// HTTP2Request reads the head of one HTTP/2 request, as an HTTP/2 server
// decoded it (HPACK undone, pseudo-header fields checked), into a Request
// held to the reading an HTTP/1.1 head gets: the same target forms and
// canonical path, the same host, the same overrides refused, a header a
// rule names (refuseRepeated, lowercase) refused when sent twice. Only
// framing differs: HTTP/2 frames every body, so no body can be read two
// ways and none is refused for its method. CONNECT, which opens a tunnel
// whose bytes are not requests, is refused.
//
// method, path and authority are the :method, :path and :authority
// pseudo-header fields; fields the header fields, names lowercase.
func HTTP2Request(method, path, authority string, fields []Field, refuseRepeated []string) (*Request, *RequestError) {
	r := &Request{Method: method, Proto: ProtoHTTP2, Header: fields}
	if !isToken([]byte(method)) {
		return nil, refuse(ErrMalformed, 0, ":method %q is not a token", method)
	}
	if method == "CONNECT" {
		return nil, refuse(ErrUnsupportedVersion, 0, "CONNECT over HTTP/2 opens a tunnel the rules cannot read")
	}
	if path != "*" && !strings.HasPrefix(path, "/") {
		return nil, refuse(ErrMalformed, 0, ":path %q is neither /path nor *", path)
	}
	if err := r.parseTarget(path, 0); err != nil {
		return nil, err
	}
	for _, f := range fields {
		if f.Name == "" || f.Name != lower(f.Name) || !isToken([]byte(f.Name)) {
			return nil, refuse(ErrMalformed, 0, "header name %q", f.Name)
		}
		for i := 0; i < len(f.Value); i++ {
			if !isFieldValueByte(f.Value[i]) {
				return nil, refuse(ErrMalformed, 0, "byte %q in the value of %s", f.Value[i], f.Name)
			}
		}
		if overrideHeaders[f.Name] {
			return nil, refuse(ErrAmbiguousTarget, 0, "%s asks the application for another method or target than the rules read", f.Name)
		}
	}
	host, err := canonicalHost(authority)
	if err != nil {
		return nil, refuse(ErrAmbiguousTarget, 0, ":authority %q: %v", authority, err)
	}
	r.Host = host
	// A Host field beside :authority must name the same host: a server
	// may route on either.
	if err := r.readHost(0); err != nil {
		return nil, err
	}
	for _, name := range refuseRepeated {
		if n := len(r.Values(name)); n > 1 {
			return nil, refuse(ErrAmbiguousHeader, 0, "%s sent %d times", name, n)
		}
	}
	return r, nil
}

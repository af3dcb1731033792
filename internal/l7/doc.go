// Package l7 reads HTTP/1.1 requests off a connection's inbound stream and
// judges them against HTTP rules. It is pure: bytes and rules go in,
// requests, verdicts and errors come out, so the parser and the matcher
// are testable and fuzzable without a kernel, and the datapath's in-kernel
// parser is held to this one (the same framing, the same canonical path).
//
// The parser is strict on purpose. A rule can only hold if the proxy and
// the server agree where each request starts and what it asks for; where
// HTTP lets two readers disagree (Content-Length beside Transfer-Encoding,
// two Content-Lengths, obs-fold, bare CR or LF, a path with dot segments
// or encoded slashes, a header a rule names sent twice) the request is
// refused with 400 instead of guessed at, and the connection is closed.
//
// Rules follow Gateway API's HTTPRouteMatch (method, path Exact /
// PathPrefix / RegularExpression, headers Exact / RegularExpression) plus
// header presence and hostnames (exact or "*." wildcard, as HTTPRoute's
// hostnames). Paths are matched in a canonical form (see CanonicalPath),
// the same for a rule's value and a request's target.
package l7

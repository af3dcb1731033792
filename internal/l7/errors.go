package l7

import (
	"errors"
	"fmt"
)

// Sentinel errors of a request the parser refuses; a RequestError wraps one.
var (
	// ErrMalformed is a request that is not HTTP/1.x as RFC 9112 writes it.
	ErrMalformed = errors.New("malformed request")
	// ErrAmbiguousFraming is a request whose end two readers could place
	// differently: Content-Length with Transfer-Encoding, two lengths, a
	// transfer coding that does not end in chunked, a bad chunk size.
	ErrAmbiguousFraming = errors.New("ambiguous message framing")
	// ErrAmbiguousTarget is a target two servers could read as different
	// resources: dot segments, encoded slashes, an empty segment, a Host
	// that disagrees with an absolute target, no or two Hosts.
	ErrAmbiguousTarget = errors.New("ambiguous request target")
	// ErrAmbiguousHeader is a header a rule names sent more than once.
	ErrAmbiguousHeader = errors.New("header a rule names appears more than once")
	// ErrHeadTooLarge is a head (or a chunk line or trailer section) over
	// the parser's limits.
	ErrHeadTooLarge = errors.New("request head too large")
	// ErrUnsupportedVersion is a request line with a version other than
	// HTTP/1.0 or HTTP/1.1.
	ErrUnsupportedVersion = errors.New("unsupported HTTP version")
	// ErrFailed is any input after the parser has refused a request: the
	// connection must be closed, nothing after a refusal can be framed.
	ErrFailed = errors.New("parser already refused this connection")
)

// RequestError is a refused request: the status to answer with, and why.
type RequestError struct {
	// Status is the response status: always 400, as for every request
	// the parser cannot frame or read one way only (nginx answers an
	// over-long head with 400 too).
	Status int
	// Offset is the stream offset of the byte that decided it.
	Offset int64
	// Framed is the stream offset of the first byte that belongs to no
	// accepted request: the start of the refused head, or of the chunk
	// line, trailer line or chunk end that broke an accepted request's
	// body. Bytes before it may reach the server; none from it on.
	Framed int64
	// Reason says what was wrong, for the flow record and the log; it is
	// never sent to the client.
	Reason string
	Err    error
}

func (e *RequestError) Error() string {
	return fmt.Sprintf("%v at byte %d: %s (answer %d)", e.Err, e.Offset, e.Reason, e.Status)
}

func (e *RequestError) Unwrap() error { return e.Err }

func refuse(err error, offset int64, format string, args ...any) *RequestError {
	return &RequestError{Status: 400, Offset: offset, Reason: fmt.Sprintf(format, args...), Err: err}
}

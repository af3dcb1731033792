package l7

// Limits bound what one connection may make the parser hold.
type Limits struct {
	// MaxHead is the longest request head, request line to the blank
	// line, leading blank lines included (nginx's default buffer is 8 KiB
	// with large_client_header_buffers of 4 x 8 KiB; 16 KiB takes heads
	// nginx takes in its default setup).
	MaxHead int
	// MaxHeaders is the most header fields one head may have.
	MaxHeaders int
	// MaxChunkLine is the longest chunk-size line, extensions included.
	MaxChunkLine int
	// MaxTrailer is the longest trailer section of a chunked body.
	MaxTrailer int
}

// DefaultLimits are the limits NewParser uses for a zero Limits.
var DefaultLimits = Limits{MaxHead: 16 << 10, MaxHeaders: 100, MaxChunkLine: 1 << 10, MaxTrailer: 8 << 10}

type parseState uint8

const (
	stHead      parseState = iota // gathering a head
	stBody                        // Content-Length bytes left: remaining
	stChunkLine                   // gathering a chunk-size line
	stChunkData                   // chunk bytes left: remaining
	stChunkCRLF                   // the CRLF after a chunk's data
	stTrailer                     // gathering the trailer section
	stFailed                      // refused: nothing more is read
)

// Parser reads one connection's inbound stream as a sequence of HTTP/1.1
// requests. Bytes may arrive split anywhere (each TCP segment as it
// comes); Feed returns each request whose head completed in what it was
// given, and the first error ends the connection.
type Parser struct {
	limits    Limits
	state     parseState
	offset    int64  // stream offset of the next byte Feed reads
	buf       []byte // the head, chunk line or trailer being gathered
	bufStart  int64  // stream offset of buf[0]
	remaining int64  // body or chunk bytes left
	fields    int    // trailer fields seen
	err       *RequestError
	// headerNames are the header names (lowercase) whose repetition
	// makes a request ambiguous; see Parser.RefuseRepeated.
	headerNames map[string]bool
}

// NewParser returns a parser with the given limits; zero fields take
// DefaultLimits' values.
func NewParser(l Limits) *Parser {
	if l.MaxHead <= 0 {
		l.MaxHead = DefaultLimits.MaxHead
	}
	if l.MaxHeaders <= 0 {
		l.MaxHeaders = DefaultLimits.MaxHeaders
	}
	if l.MaxChunkLine <= 0 {
		l.MaxChunkLine = DefaultLimits.MaxChunkLine
	}
	if l.MaxTrailer <= 0 {
		l.MaxTrailer = DefaultLimits.MaxTrailer
	}
	return &Parser{limits: l}
}

// RefuseRepeated makes a head that carries any of these header names more
// than once a refused request (ErrAmbiguousHeader): the names a port's
// rules match on, where two values would let the rule read one and the
// server the other.
func (p *Parser) RefuseRepeated(names []string) {
	p.headerNames = map[string]bool{}
	for _, n := range names {
		p.headerNames[lower(n)] = true
	}
}

// Offset is the stream offset of the next byte the parser reads: every
// byte before it has been framed.
func (p *Parser) Offset() int64 { return p.offset }

// Unframed is the stream offset of the first byte not yet known to belong
// to a request whose head was returned: the start of a head still being
// gathered, else Offset. A gateway may pass on what lies before it.
func (p *Parser) Unframed() int64 {
	if p.state == stHead && len(p.buf) > 0 {
		return p.bufStart
	}
	return p.offset
}

// InBody says whether the next byte belongs to a request's body (or its
// chunk framing) rather than to a head.
func (p *Parser) InBody() bool { return p.state != stHead && p.state != stFailed }

// Feed reads the next bytes of the stream. It returns the requests whose
// heads ended in data, in order, and a *RequestError when a request is
// refused: the requests before it stand, and the parser refuses
// everything after it (ErrFailed).
func (p *Parser) Feed(data []byte) ([]*Request, error) {
	if p.state == stFailed {
		return nil, p.err
	}
	var reqs []*Request
	for i := 0; i < len(data); {
		n, req, err := p.step(data[i:])
		i += n
		p.offset += int64(n)
		if req != nil {
			reqs = append(reqs, req)
		}
		if err != nil {
			err.Framed = p.bufStart
			p.state = stFailed
			p.err = err
			return reqs, err
		}
	}
	return reqs, nil
}

// step consumes a prefix of data in the current state and says how much.
func (p *Parser) step(data []byte) (int, *Request, *RequestError) {
	switch p.state {
	case stBody, stChunkData:
		n := int64(len(data))
		if n > p.remaining {
			n = p.remaining
		}
		p.remaining -= n
		if p.remaining == 0 {
			if p.state == stBody {
				p.state = stHead
			} else {
				p.state = stChunkCRLF
				p.buf = p.buf[:0]
				p.bufStart = p.offset + n
			}
		}
		return int(n), nil, nil
	case stChunkCRLF:
		return p.stepChunkCRLF(data)
	}
	// stHead, stChunkLine, stTrailer gather lines byte by byte.
	for i, c := range data {
		if len(p.buf) == 0 {
			p.bufStart = p.offset + int64(i)
		}
		p.buf = append(p.buf, c)
		if err := p.checkLineEnding(int64(i)); err != nil {
			return i + 1, nil, err
		}
		if err := p.checkLimit(int64(i)); err != nil {
			return i + 1, nil, err
		}
		if c != '\n' {
			continue
		}
		req, done, err := p.endOfLine(int64(i))
		if err != nil || done {
			return i + 1, req, err
		}
	}
	return len(data), nil, nil
}

// checkLineEnding refuses a bare CR or a bare LF at the end of buf: every
// line ends in CRLF, and nothing else may hold either.
func (p *Parser) checkLineEnding(i int64) *RequestError {
	n := len(p.buf)
	c := p.buf[n-1]
	if c == '\n' && (n < 2 || p.buf[n-2] != '\r') {
		return refuse(ErrMalformed, p.offset+i, "bare LF")
	}
	if n >= 2 && p.buf[n-2] == '\r' && c != '\n' {
		return refuse(ErrMalformed, p.offset+i, "bare CR")
	}
	return nil
}

func (p *Parser) checkLimit(i int64) *RequestError {
	switch {
	case p.state == stHead && len(p.buf) > p.limits.MaxHead:
		return refuse(ErrHeadTooLarge, p.offset+i, "head longer than %d bytes", p.limits.MaxHead)
	case p.state == stChunkLine && len(p.buf) > p.limits.MaxChunkLine:
		return refuse(ErrHeadTooLarge, p.offset+i, "chunk-size line longer than %d bytes", p.limits.MaxChunkLine)
	case p.state == stTrailer && len(p.buf) > p.limits.MaxTrailer:
		return refuse(ErrHeadTooLarge, p.offset+i, "trailer section longer than %d bytes", p.limits.MaxTrailer)
	}
	return nil
}

// endOfLine acts on a line that just ended at buf's end (offset p.offset+i).
func (p *Parser) endOfLine(i int64) (*Request, bool, *RequestError) {
	switch p.state {
	case stHead:
		if len(p.buf) == 2 {
			// Blank lines before a request line are skipped (RFC 9112
			// section 2.2), as every server does after a body.
			p.buf = p.buf[:0]
			return nil, false, nil
		}
		if !hasBlankLineEnd(p.buf) {
			return nil, false, nil
		}
		req, err := parseHead(p.buf, p.bufStart, p.limits, p.headerNames)
		p.buf = p.buf[:0]
		if err != nil {
			return nil, true, err
		}
		p.startBody(req)
		return req, true, nil
	case stChunkLine:
		size, err := parseChunkLine(p.buf, p.bufStart)
		p.buf = p.buf[:0]
		if err != nil {
			return nil, true, err
		}
		if size == 0 {
			p.state, p.fields = stTrailer, 0
		} else {
			p.state, p.remaining = stChunkData, size
		}
		return nil, true, nil
	case stTrailer:
		if len(p.buf) == 2 {
			p.buf = p.buf[:0]
			p.state = stHead
			return nil, true, nil
		}
		line := p.buf[:len(p.buf)-2]
		p.buf = p.buf[:0]
		p.fields++
		if p.fields > p.limits.MaxHeaders {
			return nil, true, refuse(ErrHeadTooLarge, p.offset+i, "more than %d trailer fields", p.limits.MaxHeaders)
		}
		if _, _, err := parseField(line, p.offset+i-int64(len(line))-1); err != nil {
			return nil, true, err
		}
		return nil, false, nil
	}
	return nil, false, nil
}

// stepChunkCRLF reads the CRLF that must follow a chunk's data.
func (p *Parser) stepChunkCRLF(data []byte) (int, *Request, *RequestError) {
	for i, c := range data {
		want := byte('\r')
		if len(p.buf) == 1 {
			want = '\n'
		}
		if c != want {
			return i + 1, nil, refuse(ErrAmbiguousFraming, p.offset+int64(i), "chunk data longer than its size (no CRLF after it)")
		}
		p.buf = append(p.buf, c)
		if len(p.buf) == 2 {
			p.buf = p.buf[:0]
			p.state = stChunkLine
			return i + 1, nil, nil
		}
	}
	return len(data), nil, nil
}

func (p *Parser) startBody(r *Request) {
	switch {
	case r.Chunked:
		p.state = stChunkLine
	case r.ContentLength > 0:
		p.state, p.remaining = stBody, r.ContentLength
	default:
		p.state = stHead
	}
}

func hasBlankLineEnd(b []byte) bool {
	n := len(b)
	return n >= 4 && b[n-4] == '\r' && b[n-3] == '\n' && b[n-2] == '\r' && b[n-1] == '\n'
}

// parseChunkLine reads "1*HEXDIG [ ';' chunk-ext ] CRLF". Whitespace
// before the extension, a "0x" prefix, a sign or more than 15 digits are
// refused: servers read those differently.
func parseChunkLine(line []byte, start int64) (int64, *RequestError) {
	line = line[:len(line)-2]
	var size int64
	i := 0
	for ; i < len(line) && isHex(line[i]); i++ {
		if i == 15 {
			return 0, refuse(ErrAmbiguousFraming, start+int64(i), "chunk size of more than 15 hex digits")
		}
		size = size<<4 | int64(unhex(line[i]))
	}
	if i == 0 {
		return 0, refuse(ErrAmbiguousFraming, start, "chunk-size line without a hex size")
	}
	if i < len(line) {
		if line[i] != ';' {
			return 0, refuse(ErrAmbiguousFraming, start+int64(i), "chunk size followed by %q, not ';' or CRLF", line[i])
		}
		for j := i + 1; j < len(line); j++ {
			if !isFieldValueByte(line[j]) {
				return 0, refuse(ErrMalformed, start+int64(j), "control byte in a chunk extension")
			}
		}
	}
	return size, nil
}

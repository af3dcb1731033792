package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/l7"
)

// An h2c connection (HTTP/2 over cleartext, as gRPC speaks it) is handed
// whole at its preface (bpf/lib/l7proxy.h), and the kernel steers what
// its server sends into the slot too. The proxy ends HTTP/2 on both
// sides: an HTTP/2 server faces the client (reading P, writing Q, which
// the kernel sends out on the server's socket) and an HTTP/2 client faces
// the server (writing P, into the server's socket, reading Q). Each
// request is judged whole, from the head the server side decoded: an
// allowed one goes on to the server as a stream of the proxy's own
// connection, its body and the answer streamed both ways (gRPC streams,
// trailers); a denied one is answered 403 on its stream, and the
// connection goes on. Nothing of HPACK's state or of flow control has to
// be kept in step across the two connections: each side keeps its own.

// h2Limits bound what one handed HTTP/2 connection holds.
const (
	// h2MaxStreams is how many requests a client may have open at once
	// on one connection (the proxy's SETTINGS_MAX_CONCURRENT_STREAMS).
	h2MaxStreams = 100
	// h2MaxHeaderBytes bounds a request's decoded header list, as the
	// HTTP/1 parser bounds a head (16 KiB).
	h2MaxHeaderBytes = 16 << 10
	// h2DrainBytes and h2DrainTime bound what the proxy reads of the
	// rest of a body it answered in the server's place (see answerH2).
	h2DrainBytes = 256 << 10
	h2DrainTime  = time.Second
)

// answerDenied is the body of a 403, as on HTTP/1.
const answerDenied = "Access denied\n"

// serveH2 serves an h2c connection handed to s until it has ended; an
// error means the slot itself failed.
func (p *Proxy) serveH2(s *datapath.ProxySlot, h datapath.Handoff, first []byte) error {
	if !p.take(h.Client.Addr()) {
		p.expireH2(s, h, "the client holds its share of the node's proxy slots")
		return p.drain(s, h)
	}
	defer p.release(h.Client.Addr())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	over := &slotState{s: s, h: h, read: uint64(len(first))}
	client := &slotConn{read: s.In, write: s.Answer, over: over, counts: true, pending: first,
		local: net.TCPAddrFromAddrPort(h.Server), remote: net.TCPAddrFromAddrPort(h.Client)}
	server := &slotConn{read: s.Answer, write: s.In, over: over,
		local: net.TCPAddrFromAddrPort(h.Client), remote: net.TCPAddrFromAddrPort(h.Server)}
	defer client.Close()
	defer server.Close()

	tr := &http2.Transport{AllowHTTP: true, MaxHeaderListSize: 1 << 20}
	cc, err := tr.NewClientConn(server)
	if err != nil {
		// The connection ended before the proxy spoke to the server.
		p.log.Debug("h2c: open the server side", "slot", s.Slot, "err", err)
		p.endH2(s, h)
		return nil
	}
	defer cc.Close()
	hs := &h2Handler{p: p, s: s, h: h, cc: cc, over: over}
	srv := &http2.Server{MaxConcurrentStreams: h2MaxStreams, MaxReadFrameSize: 1 << 20}
	if p.limits.IdleTimeout > 0 {
		srv.IdleTimeout = p.limits.IdleTimeout
	}
	srv.ServeConn(client, &http2.ServeConnOpts{Context: ctx, Handler: hs,
		BaseConfig: &http.Server{MaxHeaderBytes: h2MaxHeaderBytes, ReadHeaderTimeout: p.limits.HeadTimeout}})
	// The client side ended (the connection closed, or a protocol error
	// the server side answered with GOAWAY): nothing more goes either way.
	p.endH2(s, h)
	if over.failed() != nil {
		return over.failed()
	}
	return p.drain(s, h)
}

// endH2 ends the slot's HTTP/2 connection: the kernel drops what either
// end sends from now on, and resets it after a grace for what the proxy
// wrote last (a GOAWAY) to leave.
func (p *Proxy) endH2(s *datapath.ProxySlot, h datapath.Handoff) {
	if err := s.End(h, false, 0, false); err != nil {
		p.log.Warn("end a handed h2c connection", "slot", s.Slot, "err", err)
	}
}

// expireH2 ends an h2c connection for a limit before any of it is read,
// recorded as refused (503, the status a server would have given).
func (p *Proxy) expireH2(s *datapath.ProxySlot, h datapath.Handoff, reason string) {
	p.mu.Lock()
	p.stats.ClientShareEnds++
	p.mu.Unlock()
	p.endH2(s, h)
	p.record(Record{Handoff: h, Sets: h.Sets, Decision: Decision{Verdict: Refuse}, Ended: true,
		Err: &l7.RequestError{Status: 503, Reason: reason}})
}

// drain reads what the kernel redirected to the slot before the
// connection ended, so the next connection's stream starts clean.
func (p *Proxy) drain(s *datapath.ProxySlot, h datapath.Handoff) error {
	buf := make([]byte, 16<<10)
	var since time.Time
	for {
		now, err := s.Handoff()
		if err != nil {
			return err
		}
		if now.Cookie != h.Cookie {
			return fmt.Errorf("proxy slot %d: taken by another connection", s.Slot)
		}
		if now.Closed {
			if since.IsZero() {
				since = time.Now()
			} else if time.Since(since) > drainWait {
				return nil
			}
		}
		for _, c := range []*net.TCPConn{s.In, s.Answer} {
			c.SetReadDeadline(time.Now().Add(pollClosed / 4))
			if _, err := c.Read(buf); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				return err
			}
		}
		if now.Closed {
			return nil
		}
	}
}

// slotState says whether the connection a slot serves has ended, for
// both of its HTTP/2 sides.
type slotState struct {
	s    *datapath.ProxySlot
	h    datapath.Handoff
	read uint64 // client bytes read

	mu  sync.Mutex
	err error // the slot failed
}

// ended says whether the connection is over: it closed (and, for the
// client's side, what it sent is all read), or the slot serves another.
func (st *slotState) ended(clientSide bool) bool {
	now, err := st.s.Handoff()
	if err != nil {
		st.fail(err)
		return true
	}
	if now.Cookie != st.h.Cookie || !now.Active && !now.Closed {
		return true
	}
	if !now.Closed {
		return false
	}
	return !clientSide || st.readSoFar() >= now.Redirected
}

func (st *slotState) fail(err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.err == nil {
		st.err = err
	}
}

func (st *slotState) failed() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.err
}

func (st *slotState) addRead(n int) error {
	st.mu.Lock()
	st.read += uint64(n)
	read := st.read
	st.mu.Unlock()
	return st.s.Read(read)
}

func (st *slotState) readSoFar() uint64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.read
}

// slotConn is one side of a handed HTTP/2 connection as a net.Conn: it
// reads one of the slot's sockets and writes the other. Reads wait in
// steps of pollClosed, looking between them whether the connection has
// ended (the kernel closes nothing the proxy holds when it does).
type slotConn struct {
	read, write   *net.TCPConn
	over          *slotState
	counts        bool   // the client side: tells the kernel what it read
	pending       []byte // read before the side was made, given first
	local, remote net.Addr

	mu       sync.Mutex
	deadline time.Time // the reader's own, set by SetReadDeadline
	closed   bool
}

func (c *slotConn) Read(b []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(b, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	for {
		c.mu.Lock()
		closed, deadline := c.closed, c.deadline
		c.mu.Unlock()
		if closed {
			return 0, net.ErrClosed
		}
		wait := time.Now().Add(pollClosed)
		if !deadline.IsZero() && deadline.Before(wait) {
			wait = deadline
		}
		c.read.SetReadDeadline(wait)
		n, err := c.read.Read(b)
		if n > 0 {
			if c.counts {
				if err := c.over.addRead(n); err != nil {
					c.over.fail(err)
					return n, err
				}
			}
			return n, nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, err
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return 0, os.ErrDeadlineExceeded
		}
		if c.over.ended(c.counts) {
			return 0, io.EOF
		}
	}
}

func (c *slotConn) Write(b []byte) (int, error) {
	if err := writeAll(c.write, b); err != nil {
		return 0, err
	}
	return len(b), nil
}

// Close ends this side: a read waiting returns. The slot's sockets stay
// open for the slot (serve closes them).
func (c *slotConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.read.SetReadDeadline(time.Now())
	return nil
}

func (c *slotConn) LocalAddr() net.Addr  { return c.local }
func (c *slotConn) RemoteAddr() net.Addr { return c.remote }

func (c *slotConn) SetDeadline(t time.Time) error {
	c.SetReadDeadline(t)
	return c.SetWriteDeadline(t)
}

func (c *slotConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return nil
}

func (c *slotConn) SetWriteDeadline(t time.Time) error { return c.write.SetWriteDeadline(t) }

// h2Handler judges each request of one handed HTTP/2 connection and
// carries the allowed ones to the server.
type h2Handler struct {
	p    *Proxy
	s    *datapath.ProxySlot
	h    datapath.Handoff
	cc   *http2.ClientConn
	over *slotState
}

func (x *h2Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := Record{Handoff: x.h}
	// Recorded however the request ends (an aborted stream too).
	defer func() { x.p.record(rec) }()
	// Policy reaches a handed connection as it does one the kernel
	// reads: each request is judged against the sets its flow names now.
	sets, ok, err := x.s.FlowSets(x.h)
	if err != nil || !ok {
		// The flow is gone (or unreadable): the connection ends.
		x.p.endH2(x.s, x.h)
		panic(http.ErrAbortHandler)
	}
	conn := Conn{Server: x.h.Server, Client: x.h.Client, Sets: sets, Egress: x.h.Egress}
	rec.Sets = sets
	req, rerr := l7.HTTP2Request(r.Method, r.RequestURI, r.Host, fieldsOf(r.Header), x.p.judge.HeaderNames(conn))
	if rerr != nil {
		rec.Decision, rec.Err, rec.Answered = Decision{Verdict: Refuse}, rerr, true
		answerH2(w, r, http.StatusBadRequest, "Bad request\n")
		return
	}
	rec.Request = req
	rec.Decision = x.p.judge.Judge(conn, req)
	switch rec.Decision.Verdict {
	case Allow:
		rec.Status, rec.Latency = x.forward(w, r)
	case Deny:
		rec.Answered = true
		answerH2(w, r, http.StatusForbidden, answerDenied)
	default:
		rec.Answered = true
		answerH2(w, r, http.StatusBadRequest, "Bad request\n")
	}
}

// answerH2 answers a request in the server's place, on its stream: the
// answer's head and body go out at once, and its end waits for the rest
// of the request's body, read and dropped (up to h2DrainBytes, for up to
// h2DrainTime). Were the handler to return with the body unread, the
// HTTP/2 server would end the stream with RST_STREAM(NO_ERROR) after the
// answer, which the protocol allows but some clients take for a failed
// request: curl 7.88 reported about one such 403 in seven as a framing
// error (exit 92). A client that sends more, or slower, still gets the
// reset.
func answerH2(w http.ResponseWriter, r *http.Request, status int, body string) {
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(status)
	io.WriteString(w, body)
	rc := http.NewResponseController(w)
	if rc.Flush() != nil || rc.SetReadDeadline(time.Now().Add(h2DrainTime)) != nil {
		return
	}
	io.Copy(io.Discard, io.LimitReader(r.Body, h2DrainBytes))
}

// forward carries an allowed request to the server and its answer back,
// streaming both bodies (a gRPC call may stream either way); it returns
// the server's status (0: none came) and how long the answer's head took.
// A failure after the answer began resets the client's stream.
func (x *h2Handler) forward(w http.ResponseWriter, r *http.Request) (int, time.Duration) {
	// The target goes on as the client sent it, the form the rules read.
	out := &http.Request{
		Method: r.Method, URL: &url.URL{Scheme: "http", Host: r.Host, Opaque: r.RequestURI},
		Proto: "HTTP/2.0", ProtoMajor: 2, Header: r.Header.Clone(), Host: r.Host,
		Body: r.Body, ContentLength: r.ContentLength, Trailer: r.Trailer,
	}
	out = out.WithContext(r.Context())
	began := time.Now()
	res, err := x.cc.RoundTrip(out)
	if err != nil {
		answerH2(w, r, http.StatusBadGateway, "Bad gateway\n")
		return 0, 0
	}
	took := time.Since(began)
	defer res.Body.Close()
	for k, vs := range res.Header {
		w.Header()[k] = vs
	}
	for k := range res.Trailer {
		w.Header().Add("Trailer", k)
	}
	w.WriteHeader(res.StatusCode)
	// The head goes now: a streaming call's client waits for it before
	// it sends on.
	flush := http.NewResponseController(w)
	flush.Flush()
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	for {
		n, err := res.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				panic(http.ErrAbortHandler)
			}
			flush.Flush()
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// The server reset the stream, or its connection ended.
			panic(http.ErrAbortHandler)
		}
	}
	for k, vs := range res.Trailer {
		w.Header()[http.TrailerPrefix+k] = vs
	}
	return res.StatusCode, took
}

// copyBufs are the buffers answers are copied through: one a request
// in flight, not one allocated a request.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// fieldsOf lists a decoded header as fields, names lowercase.
func fieldsOf(h http.Header) []l7.Field {
	var out []l7.Field
	for k, vs := range h {
		for _, v := range vs {
			out = append(out, l7.Field{Name: strings.ToLower(k), Value: v})
		}
	}
	return out
}

package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/l7"
)

// The answers the proxy writes in the server's place. They name nothing
// internal. A 403 keeps the connection: the denied request's body is
// skipped and the next request judged.
const (
	answer403      = "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: 14\r\n\r\nAccess denied\n"
	answer403Close = "HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: 14\r\n\r\nAccess denied\n"
	answer400      = "HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: 12\r\n\r\nBad request\n"
)

// pollClosed is how often a slot serving a connection looks whether the
// connection has closed, so the slot can serve another.
const pollClosed = 200 * time.Millisecond

// drainWait is how long a slot whose connection closed waits for bytes
// the kernel redirected and it has not read yet before it gives them up.
const drainWait = 2 * time.Second

// Limits bound what handed connections hold of the node's slots, which
// are few: without them a client sending half a head and waiting, or
// opening connection after connection, would hold every slot, and what
// the kernel hands over then is closed.
type Limits struct {
	// HeadTimeout: a request head begun must be whole within it, else
	// the connection ends (its request is recorded refused, status 408).
	HeadTimeout time.Duration
	// IdleTimeout: a connection that sends nothing for it ends; 0, the
	// default, never. The proxy does not see the server's answers, so
	// a long download or watch after its request looks idle too: set it
	// only where answers are short.
	IdleTimeout time.Duration
	// ClientShare: while a quarter of the slots or fewer are free, a
	// connection handed from a client address already holding this many
	// slots ends at once.
	ClientShare int
}

// DefaultLimits are the limits of a proxy serving slots slots: a head
// whole within 10 s (nginx waits 60 s, but holds no scarce slot), no
// idle limit, an eighth of the slots for one client under pressure.
func DefaultLimits(slots int) Limits {
	return Limits{HeadTimeout: 10 * time.Second, ClientShare: max(4, slots/8)}
}

// Stats count what the limits did, and the slots serving a connection.
type Stats struct {
	Busy                                    int
	HeadTimeouts, IdleEnds, ClientShareEnds uint64
}

// Record is a request the proxy judged, for the flow records.
type Record struct {
	Handoff datapath.Handoff
	// Request is nil for a stream refused before a head was read whole.
	Request *l7.Request
	// Sets are the HTTP sets it was judged against (policy may have
	// changed them since the hand-off).
	Sets     [3]uint32
	Decision Decision
	Err      *l7.RequestError
	// Answered: a 403 or 400 was sent in the server's place; Ended: the
	// connection ended with it (reset once the server's answers went).
	Answered, Ended bool
	// Status is the server's answer to an allowed request and Latency
	// the time to its head, where the proxy saw it (HTTP/2, whose
	// answers pass the proxy); 0 otherwise.
	Status  int
	Latency time.Duration
}

// Opener makes the pair of a hand-off slot and offers it to the kernel
// (datapath.L7Proxy.OpenSlot).
type Opener interface {
	OpenSlot(slot uint32) (*datapath.ProxySlot, error)
}

// Proxy serves hand-off slots: each reads the connection handed to it,
// judges its requests, writes back what is allowed and answers what is
// not, then makes a fresh pair for the next connection (no byte of one
// connection can reach the next).
type Proxy struct {
	judge  Judge
	opener Opener
	record func(Record)
	log    *slog.Logger

	limits Limits

	mu     sync.Mutex
	slots  map[uint32]*datapath.ProxySlot
	closed bool
	// held counts the slots serving each client address.
	held  map[netip.Addr]int
	stats Stats
	wg    sync.WaitGroup
}

// New is a proxy judging with judge, opening slots with opener, giving
// each judged request to record (which may be nil).
func New(judge Judge, opener Opener, record func(Record), log *slog.Logger) *Proxy {
	if record == nil {
		record = func(Record) {}
	}
	return &Proxy{judge: judge, opener: opener, record: record, log: log,
		slots: map[uint32]*datapath.ProxySlot{}, held: map[netip.Addr]int{}}
}

// SetLimits sets the limits; Start fills the fields left zero from
// DefaultLimits (IdleTimeout stays off). Call it before Start.
func (p *Proxy) SetLimits(l Limits) { p.limits = l }

// Stats reads the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Start opens slots 0..n-1 and serves them until Close.
func (p *Proxy) Start(n int) error {
	def := DefaultLimits(n)
	if p.limits.HeadTimeout <= 0 {
		p.limits.HeadTimeout = def.HeadTimeout
	}
	if p.limits.ClientShare <= 0 {
		p.limits.ClientShare = def.ClientShare
	}
	for i := range n {
		s, err := p.opener.OpenSlot(uint32(i))
		if err != nil {
			return fmt.Errorf("open proxy slot %d: %w", i, err)
		}
		if !p.adopt(s) {
			return errors.New("the proxy is closed")
		}
		p.wg.Add(1)
		go p.serve(s)
	}
	return nil
}

// adopt records s as its slot's pair; false when the proxy is closed
// (s is closed then).
func (p *Proxy) adopt(s *datapath.ProxySlot) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		s.Close()
		return false
	}
	p.slots[s.Slot] = s
	return true
}

// take counts a slot as serving client; false when the client already
// holds its share while a quarter of the slots or fewer are free (the
// slot is not counted then).
func (p *Proxy) take(client netip.Addr) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.slots)
	if n-p.stats.Busy <= n/4 && p.held[client] >= p.limits.ClientShare {
		p.stats.ClientShareEnds++
		return false
	}
	p.held[client]++
	p.stats.Busy++
	return true
}

func (p *Proxy) release(client netip.Addr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held[client]--; p.held[client] <= 0 {
		delete(p.held, client)
	}
	p.stats.Busy--
}

func (p *Proxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Close closes every slot and waits for their loops. A connection a
// slot served is closed by the kernel from then on (fail closed).
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	var errs []error
	for _, s := range p.slots {
		errs = append(errs, s.Close())
	}
	p.mu.Unlock()
	p.wg.Wait()
	return errors.Join(errs...)
}

// serve runs one slot: a connection at a time, then a fresh pair.
func (p *Proxy) serve(s *datapath.ProxySlot) {
	defer p.wg.Done()
	buf := make([]byte, 16<<10)
	for {
		if err := p.serveConnection(s, buf); err != nil {
			if p.isClosed() {
				return
			}
			// The pair broke under the connection: the kernel closes
			// it (its redirects fail), and a fresh pair takes the slot.
			p.log.Warn("proxy slot failed", "slot", s.Slot, "err", err)
		}
		s.Close()
		next := p.reopen(s.Slot)
		if next == nil || !p.adopt(next) {
			return
		}
		s = next
	}
}

// reopen makes a fresh pair for slot, retrying (with a growing pause)
// until it can or the proxy closes: while it cannot, the slot is not
// offered and the kernel closes what it would have handed over.
func (p *Proxy) reopen(slot uint32) *datapath.ProxySlot {
	pause := 10 * time.Millisecond
	for !p.isClosed() {
		s, err := p.opener.OpenSlot(slot)
		if err == nil {
			return s
		}
		p.log.Warn("proxy slot not offered", "slot", slot, "err", err, "retry", pause)
		time.Sleep(pause)
		pause = min(2*pause, 10*time.Second)
	}
	return nil
}

// serveConnection serves the connection handed to s until it has closed
// and its stream is read; an error means the slot itself is closed.
func (p *Proxy) serveConnection(s *datapath.ProxySlot, buf []byte) error {
	var (
		st      *stream
		h       datapath.Handoff
		read    uint64
		drained time.Time
		// lastByte is when the connection last sent; headSince when
		// the head it is still sending began, and headAt where.
		lastByte, headSince time.Time
		headAt              int64
	)
	for {
		s.In.SetReadDeadline(time.Now().Add(pollClosed))
		n, err := s.In.Read(buf)
		if n > 0 {
			read += uint64(n)
			lastByte = time.Now()
			if err := s.Read(read); err != nil {
				return err
			}
			if st == nil {
				if h, err = s.Handoff(); err != nil {
					return err
				}
				if !h.Active {
					// Bytes with no connection handed: the slot was
					// offered twice, or cleared. Never judge them.
					return fmt.Errorf("proxy slot %d: %d bytes for no connection", s.Slot, n)
				}
				if h.H2 {
					return p.serveH2(s, h, clone(buf[:n]))
				}
				st = newStream(p.judge, Conn{Server: h.Server, Client: h.Client, Sets: h.Sets, Egress: h.Egress}, h.Prefix)
				if !p.take(h.Client.Addr()) {
					// What the kernel allowed before the hand-off
					// goes on; nothing after it.
					steps, judged := st.feed(buf[:min(int64(n), int64(h.Prefix))])
					p.run(s, h, steps, judged)
					p.expire(s, h, st, 503, "the client holds its share of the node's proxy slots")
					continue
				}
				defer p.release(h.Client.Addr())
			}
			// Policy reaches a handed connection as it does one the
			// kernel reads: its next requests are judged against the
			// sets its flow names now.
			sets, ok, err := s.FlowSets(h)
			if err != nil {
				return err
			}
			if !ok && !st.ended {
				p.expire(s, h, st, 0, "")
			}
			st.restrict(sets)
			steps, judged := st.feed(buf[:n])
			p.run(s, h, steps, judged)
			// A new head starts its own clock: a head begun in this
			// read after another ended is timed from now.
			switch at := st.sent; {
			case !st.headPending():
				headSince = time.Time{}
			case headSince.IsZero() || at != headAt:
				headSince, headAt = lastByte, at
			}
			// Checked after every read too: a client sending a byte
			// now and then never lets the read time out.
			p.enforceTimeouts(s, h, st, headSince, lastByte)
			continue
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		if st == nil {
			// An HTTP/2 server that spoke first has the slot before
			// its client sends a byte (l7_server_first).
			if h, err = s.Handoff(); err != nil {
				return err
			}
			if h.H2 && (h.Active || h.Closed) {
				return p.serveH2(s, h, nil)
			}
			continue
		}
		p.enforceTimeouts(s, h, st, headSince, lastByte)
		now, err := s.Handoff()
		if err != nil {
			return err
		}
		if now.Cookie != h.Cookie {
			return fmt.Errorf("proxy slot %d: taken by another connection", s.Slot)
		}
		if !now.Closed {
			continue
		}
		if read >= now.Redirected {
			return nil
		}
		if drained.IsZero() {
			drained = time.Now()
		} else if time.Since(drained) > drainWait {
			return nil // the rest was lost on the way; a fresh pair follows
		}
	}
}

// enforceTimeouts ends a connection whose head has taken longer than
// HeadTimeout, or that has sent nothing for IdleTimeout.
func (p *Proxy) enforceTimeouts(s *datapath.ProxySlot, h datapath.Handoff, st *stream, headSince, lastByte time.Time) {
	if st.ended {
		return
	}
	switch {
	case !headSince.IsZero() && time.Since(headSince) > p.limits.HeadTimeout:
		p.mu.Lock()
		p.stats.HeadTimeouts++
		p.mu.Unlock()
		p.expire(s, h, st, 408, fmt.Sprintf("request head not whole after %v", p.limits.HeadTimeout))
	case p.limits.IdleTimeout > 0 && time.Since(lastByte) > p.limits.IdleTimeout:
		p.mu.Lock()
		p.stats.IdleEnds++
		p.mu.Unlock()
		p.expire(s, h, st, 0, "")
	}
}

// expire ends a connection for a limit: nothing more of it reaches the
// server, and it is reset once the server's answers have gone (no answer
// is written in its place). A reason is recorded as a refused request,
// with the status a server would have given (408, 503); an idle
// connection, which was sending no request, is not recorded.
func (p *Proxy) expire(s *datapath.ProxySlot, h datapath.Handoff, st *stream, status int, reason string) {
	at := st.offset - 1
	st.end(nil)
	p.end(s, step{kind: stepEnd, at: at, lastAllowedAt: st.lastAllowedAt}, false)
	if reason != "" {
		p.record(Record{Handoff: h, Sets: st.conn.Sets, Decision: Decision{Verdict: Refuse}, Ended: true,
			Err: &l7.RequestError{Status: status, Offset: st.offset, Framed: st.sent, Reason: reason}})
	}
}

// run carries the steps out, in order, and records the requests. After
// an end, or a failed write, nothing more is done for the connection.
func (p *Proxy) run(s *datapath.ProxySlot, h datapath.Handoff, steps []step, judged []judged) {
	answered, ended := false, false
	for _, st := range steps {
		if ended {
			break
		}
		switch st.kind {
		case stepForward:
			if err := writeAll(s.In, st.data); err != nil {
				// The kernel no longer takes it (the connection
				// closed), or the server's socket cannot: end it.
				p.end(s, step{kind: stepEnd, at: -1, lastAllowedAt: -1}, false)
				ended = true
			}
		case stepAnswer:
			if !p.answer(s, st) {
				ended = true
				continue
			}
			answered = true
		case stepEnd:
			p.end(s, st, answered)
			ended = true
		}
	}
	for _, j := range judged {
		p.record(Record{Handoff: h, Request: j.req, Sets: j.sets, Decision: j.decision, Err: j.err,
			Answered: answered && j.decision.Verdict != Allow, Ended: ended})
	}
}

// writeRetry bounds how long a write waits for the kernel to find memory
// for the server socket's queue (bpf_tcp_ingress fails with ENOMEM under
// memory pressure, and nothing tells when it would succeed).
const writeRetry = 2 * time.Second

// writeAll writes b, retrying what the kernel could not queue for lack
// of memory.
func writeAll(c *net.TCPConn, b []byte) error {
	deadline := time.Now().Add(writeRetry)
	for {
		n, err := c.Write(b)
		b = b[n:]
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.ENOMEM) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

// progress is how far the server had written when the skb holding the
// head of st's request arrived (known: the slot still remembers it), and
// whether it then still owed an answer to the last request it was given
// (always, when unknown).
func progress(h datapath.Handoff, st step) (seq uint32, known, owes bool) {
	seq, known = h.SeqAt(uint64(st.at))
	switch {
	case st.lastAllowedAt >= 0:
		seqAllow, ok := h.SeqAt(uint64(st.lastAllowedAt))
		return seq, known && ok, !known || !ok || seq == seqAllow
	case h.Owes:
		return seq, known, !known || seq == h.SeqOwed
	}
	return seq, known, false
}

// answer writes an answer in the server's place if the server has
// written since the last request it was given (the kernel's test,
// l7_answer_safe); otherwise it ends the connection, to be reset once
// the server's answer has gone, and says false.
func (p *Proxy) answer(s *datapath.ProxySlot, st step) bool {
	h, err := s.Handoff()
	if err != nil {
		return false
	}
	seq, known, owes := progress(h, st)
	if owes {
		s.End(h, known, seq, true)
		return false
	}
	text := answer403
	switch {
	case st.status != 403:
		text = answer400
	case st.close:
		text = answer403Close
	}
	if _, err := s.Answer.Write([]byte(text)); err != nil {
		s.End(h, known, seq, false)
		return false
	}
	return true
}

// end ends the connection: reset once what the server owes, and the
// answer just written, have gone.
func (p *Proxy) end(s *datapath.ProxySlot, st step, answered bool) {
	h, err := s.Handoff()
	if err != nil {
		return
	}
	seq, known, owes := progress(h, st)
	if err := s.End(h, known, seq, owes || answered); err != nil {
		p.log.Warn("end a handed connection", "slot", s.Slot, "err", err)
	}
}

var _ Opener = (*datapath.L7Proxy)(nil)

package proxy

import (
	"errors"
	"net/netip"

	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/policy"
)

// Verdict is what a judge decides of one request.
type Verdict uint8

// The verdicts.
const (
	// Allow: the request goes to the server.
	Allow Verdict = iota + 1
	// Deny: no rule allows it; it is answered 403 and skipped.
	Deny
	// Refuse: it cannot be judged safely (a header a rule names sent
	// twice); answered 400, and the connection ends.
	Refuse
)

func (v Verdict) String() string {
	switch v {
	case Allow:
		return "allowed"
	case Deny:
		return "denied"
	case Refuse:
		return "refused"
	}
	return "unknown"
}

// Decision is a judge's verdict on a request, with the rule that allowed
// it (Set, Rule) when it was allowed by a set's rule, or the policy's
// whole decision (Policy) when the precedence order was walked for it
// (TierJudge).
type Decision struct {
	Verdict Verdict
	Set     uint32
	Rule    int
	Policy  *policy.HTTPDecision
}

// Conn is a handed connection as a judge sees it: its ends (Server is
// the local pod, or with Egress the Client is) and the kernel HTTP sets
// its flow names now.
type Conn struct {
	Server, Client netip.AddrPort
	Sets           [3]uint32
	// Egress: the client's egress policy judges the requests.
	Egress bool
}

// Judge decides the requests of a handed connection.
type Judge interface {
	Judge(c Conn, r *l7.Request) Decision
	// HeaderNames are the header names the rules that judge c match
	// on: a head carrying one twice is refused.
	HeaderNames(c Conn) []string
}

// stepKind is what a step does.
type stepKind uint8

const (
	// stepForward writes data to the server.
	stepForward stepKind = iota + 1
	// stepAnswer answers a denied or refused request in the server's
	// place, if the server has written since the last request it was
	// given (else the connection ends without it).
	stepAnswer
	// stepEnd ends the connection: nothing more reaches the server.
	stepEnd
)

// step is one thing a slot does with a connection, in order.
type step struct {
	kind   stepKind
	data   []byte // stepForward
	status int    // stepAnswer: 403 or 400
	close  bool   // stepAnswer: the answer says the connection closes
	// at is the stream offset where the head of the request the step
	// concerns ended (the skb that holds it tells how far the server had
	// written then); lastAllowedAt the same of the last request allowed
	// before it, -1 for none since the hand-off.
	at, lastAllowedAt int64
}

// judged is one request the stream decided, for the record.
type judged struct {
	req      *l7.Request
	sets     [3]uint32 // what it was judged against (the flow's sets)
	decision Decision
	err      *l7.RequestError // a refused stream: req is nil
}

// stream decides, byte by byte, what of a handed connection's request
// stream reaches the server. The first prefix bytes were allowed by the
// kernel; a head begins after them.
type stream struct {
	judge  Judge
	conn   Conn
	prefix int64
	parser *l7.Parser
	// offset is where the next byte fed sits in the stream; sent how far
	// the stream is decided; held the bytes from sent on, not yet
	// decided (a head still being gathered).
	offset, sent int64
	held         []byte
	// forwarding says whether the bytes being decided belong to an
	// allowed request (or the prefix).
	forwarding    bool
	lastAllowedAt int64
	ended         bool
}

func newStream(j Judge, c Conn, prefix uint32) *stream {
	p := l7.NewParser(l7.Limits{})
	p.RefuseRepeated(j.HeaderNames(c))
	return &stream{judge: j, conn: c, prefix: int64(prefix), parser: p, forwarding: true, lastAllowedAt: -1}
}

// feed reads the next bytes of the stream and returns the steps they
// decide, and the requests judged.
func (s *stream) feed(data []byte) ([]step, []judged) {
	if s.ended {
		return nil, nil
	}
	var steps []step
	// The prefix was allowed in the kernel: it goes unread.
	if s.offset < s.prefix {
		n := min(int64(len(data)), s.prefix-s.offset)
		steps = append(steps, step{kind: stepForward, data: clone(data[:n])})
		s.offset += n
		s.sent = s.offset
		data = data[n:]
	}
	if len(data) == 0 {
		return steps, nil
	}
	s.held = append(s.held, data...)
	s.offset += int64(len(data))
	reqs, err := s.parser.Feed(data)
	var out []judged
	for _, r := range reqs {
		steps = s.release(steps, s.prefix+r.Start)
		d := s.judge.Judge(s.conn, r)
		out = append(out, judged{req: r, sets: s.conn.Sets, decision: d})
		at := s.prefix + r.Start + int64(r.HeadLen) - 1
		switch {
		case d.Verdict == Allow && r.Upgrade:
			// After a 101 the bytes are not HTTP, and only the server's
			// answer, which the proxy does not see, says whether it
			// switched: the connection ends here.
			return append(steps, step{kind: stepEnd, at: at, lastAllowedAt: s.lastAllowedAt}), s.end(out)
		case d.Verdict == Allow:
			s.forwarding = true
			s.lastAllowedAt = at
		case d.Verdict == Deny && r.Close:
			// The client asked to close after this answer: so be it.
			steps = append(steps, step{kind: stepAnswer, status: 403, close: true, at: at, lastAllowedAt: s.lastAllowedAt},
				step{kind: stepEnd, at: at, lastAllowedAt: s.lastAllowedAt})
			return steps, s.end(out)
		case d.Verdict == Deny:
			s.forwarding = false
			steps = append(steps, step{kind: stepAnswer, status: 403, at: at, lastAllowedAt: s.lastAllowedAt})
		default:
			steps = append(steps, step{kind: stepAnswer, status: 400, at: at, lastAllowedAt: s.lastAllowedAt},
				step{kind: stepEnd, at: at, lastAllowedAt: s.lastAllowedAt})
			return steps, s.end(out)
		}
	}
	var re *l7.RequestError
	if errors.As(err, &re) {
		steps = s.release(steps, s.prefix+re.Framed)
		at := s.prefix + re.Offset
		out = append(out, judged{err: re, sets: s.conn.Sets})
		steps = append(steps, step{kind: stepAnswer, status: re.Status, at: at, lastAllowedAt: s.lastAllowedAt},
			step{kind: stepEnd, at: at, lastAllowedAt: s.lastAllowedAt})
		return steps, s.end(out)
	}
	return s.release(steps, s.prefix+s.parser.Unframed()), out
}

// release decides the held bytes up to offset to: forwarded when they
// belong to an allowed request, dropped otherwise.
func (s *stream) release(steps []step, to int64) []step {
	if to <= s.sent {
		return steps
	}
	n := to - s.sent
	if s.forwarding {
		steps = append(steps, step{kind: stepForward, data: clone(s.held[:n])})
	}
	s.held = s.held[n:]
	s.sent = to
	return steps
}

// restrict judges the requests whose heads end from now on against sets:
// policy changed. Header names its rules match on are refused when
// repeated from now on too (names refused before stay refused).
func (s *stream) restrict(sets [3]uint32) {
	if sets == s.conn.Sets {
		return
	}
	s.conn.Sets = sets
	s.parser.RefuseRepeated(s.judge.HeaderNames(s.conn))
}

// headPending says whether a request head has begun and is not yet whole.
func (s *stream) headPending() bool { return !s.ended && len(s.held) > 0 }

func (s *stream) end(out []judged) []judged {
	s.ended = true
	s.held = nil
	return out
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"

	"github.com/weirnet/weir/internal/policy"
)

// L7Verdict is what a request record says of its requests
// (bpf/lib/l7events.h, L7_EV_*).
type L7Verdict uint8

// The verdicts of request records.
const (
	L7Allowed L7Verdict = 1 + iota
	L7Denied            // no rule allows it
	L7Refused           // the stream cannot be read safely (400)
	L7Punted            // the kernel cannot judge it
	L7Split             // its head did not end in the skb it began in
	// L7Replied: the record is only of the server's answers (Replies),
	// of no request.
	L7Replied
)

func (v L7Verdict) String() string {
	switch v {
	case L7Allowed:
		return "allowed"
	case L7Denied:
		return "denied"
	case L7Refused:
		return "refused"
	case L7Punted:
		return "punted"
	case L7Split:
		return "split"
	case L7Replied:
		return "replied"
	}
	return fmt.Sprintf("L7Verdict(%d)", uint8(v))
}

// L7Event is one record of the HTTP verdict: a request it judged, or
// (Repeat) the requests that repeated the connection's last record.
type L7Event struct {
	Time   time.Time // of the request, or of the last repeat
	Cookie uint64    // the judging socket's (Egress: the client's): names the connection
	// Client and Server are the connection's ends: the local pod is the
	// server, or with Egress the client.
	Client, Server netip.AddrPort
	// Egress: the client's egress rules judged the request, on its
	// socket as it sent it (bpf/lib/l7client.h); else the server's
	// ingress rules did, on its socket as it received it.
	Egress bool
	// Sets are the flow's kernel HTTP sets it was judged against (0:
	// none); Set the one whose rule Rule allowed it, 0 when the flow was
	// no longer restricted (Node.PolicyHTTPSet names them).
	Sets    [3]uint32
	Set     uint32
	Rule    int
	Count   uint32 // requests the record stands for
	Verdict L7Verdict
	// Error is the reader's code for a refused or punted stream
	// (bpf/lib/http.h HTTP_ERR_*, HTTP_PUNT_*).
	Error uint8
	// Repeat: Count requests the rules saw as the connection's last
	// recorded one, allowed by the same rule; Line and Host are empty.
	Repeat bool
	// Answered: the kernel answered in the server's place (403, 400).
	Answered bool
	// Closed: the connection carries no more bytes after it.
	Closed bool
	// Upgrade and UserRules say why the verdict punted a head the reader
	// read whole: an allowed request to upgrade the connection, or one
	// only rules the kernel does not judge (regular
	// expressions) may match.
	Upgrade, UserRules bool
	// Pipelined: a denial or refusal not answered in place because the
	// server's answer to an earlier request was still to come (the
	// client pipelines); the connection was closed instead.
	Pipelined bool
	// Handed: the kernel handed the connection to user space at this
	// request, which the proxy judges (its own record follows).
	Handed bool
	// Proxied: the record is the proxy's (internal/proxy), which judged
	// the request in user space; ProxyReason says why it refused one.
	Proxied     bool
	ProxyReason string
	// Policy is the proxy's decision on a request of a flow with
	// conditional cluster rules, which it judged against the whole
	// policy (the precedence order walked for the request): what
	// decided it, in place of Set and Rule.
	Policy *policy.HTTPDecision
	// Line is the head's first bytes as they arrived (the request line
	// and what follows it); LineCut says the head was longer.
	Line    []byte
	LineCut bool
	Host    string // the Host name as it arrived
	// Replies are the server's answers since the connection's last
	// record, to its last recorded request, all of Status, on a record
	// of any verdict (bpf/lib/l7reply.h); 0: none. Latency sums their
	// times from the request going on to the answer's first byte,
	// LatencyMax is the longest. A proxy's record of an HTTP/2 request
	// (Proxied, Replies 0) has its own answer's Status and Latency: the
	// answers pass the proxy.
	Replies             uint32
	Status              int
	Latency, LatencyMax time.Duration
}

// L7EventReader reads request records. Only one reader per ring.
type L7EventReader struct{ ring *ringReader }

// OpenL7EventReader starts reading the node's request records
// (SetupL7).
func (n *Node) OpenL7EventReader() (*L7EventReader, error) {
	if n.l7objs == nil {
		return nil, errors.New("L7 is not set up on this node")
	}
	return openL7EventReader(n.l7objs.WeirL7Events)
}

// OpenEventReader starts reading the standalone path's request records.
func (s *L7Sockets) OpenEventReader() (*L7EventReader, error) {
	return openL7EventReader(s.objs.WeirL7Events)
}

func openL7EventReader(m *ebpf.Map) (*L7EventReader, error) {
	ring, err := openRing(m, "request records")
	if err != nil {
		return nil, err
	}
	return &L7EventReader{ring: ring}, nil
}

// Read blocks for the next record; after Close it returns
// ErrEventsClosed.
func (r *L7EventReader) Read() (L7Event, error) {
	b, err := r.ring.next("request record")
	if err != nil {
		return L7Event{}, err
	}
	return decodeL7Event(b, r.ring.bootOffset)
}

// Close stops the reader; a blocked Read returns ErrEventsClosed.
func (r *L7EventReader) Close() error { return r.ring.rd.Close() }

// The flags of struct l7_request_event (L7_EVF_*).
const (
	l7evRepeat   = 0x01
	l7evAnswered = 0x02
	l7evClosed   = 0x04
	l7evLineCut  = 0x08
	l7evUpgrade  = 0x10
	l7evUserRule = 0x20
	l7evPipeline = 0x40
	l7evHanded   = 0x80
)

// l7DirEgress is L7_DIR_EGRESS, struct l7_request_event's dir for a
// request its client's egress rules judged.
const l7DirEgress = 1

// l7EventSize is sizeof(struct l7_request_event).
var l7EventSize = binary.Size(l7L7RequestEvent{})

// l7ReplyFieldsSize is the size of the members the answers' records
// added (status, padding, replies, latency_ns, latency_max_ns): a record of the
// version before them is this much shorter, and still comes after an
// upgrade, from the programs of the sockets that joined before it.
const l7ReplyFieldsSize = 24

// decodeL7Event decodes struct l7_request_event by its offsets, as
// rawVerdictEvent does (TestDecodeL7EventMatchesLayout holds them to the
// generated type).
func decodeL7Event(b []byte, bootOffset time.Duration) (L7Event, error) {
	older := len(b) == l7EventSize-l7ReplyFieldsSize
	if len(b) != l7EventSize && !older {
		return L7Event{}, fmt.Errorf("decode request record: %d bytes, want %d", len(b), l7EventSize)
	}
	e := binary.NativeEndian
	ev := L7Event{
		Time:    time.Unix(0, int64(e.Uint64(b[0:]))+int64(bootOffset)),
		Cookie:  e.Uint64(b[8:]),
		Client:  netip.AddrPortFrom(addrOfBE32(e.Uint32(b[16:])), e.Uint16(b[24:])),
		Server:  netip.AddrPortFrom(addrOfBE32(e.Uint32(b[20:])), e.Uint16(b[26:])),
		Sets:    [3]uint32{e.Uint32(b[28:]), e.Uint32(b[32:]), e.Uint32(b[36:])},
		Set:     e.Uint32(b[40:]),
		Count:   e.Uint32(b[44:]),
		Verdict: L7Verdict(b[48]),
		Rule:    int(b[49]),
		Error:   b[50],
	}
	flags := b[51]
	ev.Repeat, ev.Answered = flags&l7evRepeat != 0, flags&l7evAnswered != 0
	ev.Closed, ev.LineCut = flags&l7evClosed != 0, flags&l7evLineCut != 0
	ev.Upgrade, ev.UserRules = flags&l7evUpgrade != 0, flags&l7evUserRule != 0
	ev.Pipelined, ev.Handed = flags&l7evPipeline != 0, flags&l7evHanded != 0
	lineLen, hostLen := int(e.Uint16(b[52:])), int(b[54])
	ev.Egress = b[55] == l7DirEgress
	lineAt := 56
	if !older {
		ev.Status = int(e.Uint16(b[56:]))
		ev.Replies = e.Uint32(b[60:])
		ev.Latency = time.Duration(e.Uint64(b[64:]))
		ev.LatencyMax = time.Duration(e.Uint64(b[72:]))
		lineAt += l7ReplyFieldsSize
	}
	hostAt := lineAt + 128
	if lineLen > 128 || hostLen > 64 {
		return L7Event{}, fmt.Errorf("decode request record: text of %d and %d bytes", lineLen, hostLen)
	}
	if lineLen > 0 {
		ev.Line = append([]byte(nil), b[lineAt:lineAt+lineLen]...)
	}
	ev.Host = string(b[hostAt : hostAt+hostLen])
	return ev, nil
}

// PolicyHTTPSet is the compiler's HTTP set a kernel set number names on
// this node (L7Event.Set, Sets), false for 0, a number an earlier agent
// wrote, or a node without L7.
func (n *Node) PolicyHTTPSet(kernel uint32) (policy.HTTPSetID, bool) {
	kernel &^= L7SetTiered
	if n.l7 == nil || kernel <= n.l7.base {
		return 0, false
	}
	return policy.HTTPSetID(kernel - n.l7.base), true
}

// l7Reasons say why the reader refused or punted a stream, by its code
// (bpf/lib/http.h HTTP_ERR_*, HTTP_PUNT_*).
var l7Reasons = [...]string{
	"",
	"a bare LF",
	"a bare CR",
	"a malformed request line",
	"a request target it will not read (not origin-form, or malformed)",
	"a path servers read differently (dot segment, encoded slash, empty segment, ...)",
	"an HTTP version other than 1.0 or 1.1 (HTTP/2 over cleartext, h2c as gRPC speaks it, is judged by the node's proxy when its preface opens the connection in one piece; refused here when no proxy slot was free, or later in a connection)",
	"a malformed or forbidden header field (obs-fold, whitespace before the colon, an override header, ...)",
	"ambiguous framing (Content-Length with Transfer-Encoding, two lengths, a body where none may be, ...)",
	"a missing, repeated or malformed Host",
	"a head over 16 KiB or 100 fields",
	"a malformed chunk",
	"a target the kernel does not judge (absolute form, CONNECT, OPTIONS *)",
	"a method over 16 bytes",
	"a path of more than 16 elements",
	"a host of more than 8 labels",
	"a header a rule matches on, sent more than once",
}

// Reason says why a refused or punted stream was, "" for other records.
func (e L7Event) Reason() string {
	switch {
	case e.ProxyReason != "":
		return e.ProxyReason
	case e.Upgrade:
		return "an allowed request to upgrade the connection (after a 101 the bytes are no longer HTTP; only the server's answer tells)"
	case e.UserRules && TieredSets(e.Sets):
		return "cluster rules with HTTP rules decide it in the precedence order, which the kernel does not walk"
	case e.UserRules:
		return "only rules with conditions the kernel does not judge (regular expressions) may match it"
	case e.Verdict == L7Split:
		return "its head did not arrive in one piece"
	}
	if int(e.Error) < len(l7Reasons) {
		return l7Reasons[e.Error]
	}
	return fmt.Sprintf("reader error %d", e.Error)
}

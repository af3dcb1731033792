package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/weirnet/weir/internal/policy"
)

// ErrEventsClosed is returned by EventReader.Read after Close.
var ErrEventsClosed = errors.New("event reader closed")

// VerdictEvent is one policy decision of the datapath: a drop, or the first
// packet of a newly allowed connection.
type VerdictEvent struct {
	Time      time.Time
	Ifindex   int              // host veth of the local endpoint judged
	Direction policy.Direction // of that endpoint
	// Verdict, Stage, Rule, Log and Passed are the datapath's
	// policy.Decision (bpf/lib/policy.h numbers them alike).
	Verdict  policy.Verdict
	Stage    policy.Stage
	Rule     policy.RuleID // 0: no rule decided (see Stage)
	Log      policy.RuleID
	Passed   policy.RuleID
	Peer     policy.Identity // the peer's label identity
	Src, Dst netip.AddrPort
	Proto    uint8
	// Service is the frontend (ClusterIP, NodePort address, ...) the
	// client named before the socket layer sent it to Dst; invalid when
	// the client named Dst itself, or its node did not see it
	// (bpf/lib/lbflow.h).
	Service netip.AddrPort
	// ServiceByClient says Service was found by the client and backend
	// port alone, not by the flow's socket: a UDP socket connect()ed
	// unbound is noted before it has a port (bpf/lib/lbflow.h).
	ServiceByClient bool
}

// EventReader reads the verdict ring buffer. Only one reader per node.
type EventReader struct{ ring *ringReader }

// OpenEventReader starts reading the node's verdict events.
func (n *Node) OpenEventReader() (*EventReader, error) {
	ring, err := openRing(n.progs.Events, "verdict events")
	if err != nil {
		return nil, err
	}
	return &EventReader{ring: ring}, nil
}

// Read blocks for the next event.
func (r *EventReader) Read() (VerdictEvent, error) {
	b, err := r.ring.next("verdict event")
	if err != nil {
		return VerdictEvent{}, err
	}
	return decodeVerdictEvent(b, r.ring.bootOffset)
}

// ringReader reads one of the datapath's ring buffers, which its
// programs write without waking the reader (events.h, l7events.h): it
// looks every eventPollInterval, so a burst costs one wakeup.
type ringReader struct {
	rd *ringbuf.Reader
	// bootOffset turns the kernel's monotonic timestamps into wall time.
	bootOffset time.Duration
}

func openRing(m *ebpf.Map, what string) (*ringReader, error) {
	rd, err := ringbuf.NewReader(m)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", what, err)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		rd.Close()
		return nil, fmt.Errorf("read monotonic clock: %w", err)
	}
	return &ringReader{rd: rd, bootOffset: time.Duration(time.Now().UnixNano() - ts.Nano())}, nil
}

// next blocks for the next record; after close it returns
// ErrEventsClosed.
func (r *ringReader) next(what string) ([]byte, error) {
	for {
		r.rd.SetDeadline(time.Now().Add(eventPollInterval))
		rec, err := r.rd.Read()
		switch {
		case err == nil:
			return rec.RawSample, nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			continue
		case errors.Is(err, ringbuf.ErrClosed):
			return nil, ErrEventsClosed
		}
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
}

// eventPollInterval bounds how late a flow record can be.
const eventPollInterval = 50 * time.Millisecond

// decodeVerdictEvent decodes a struct verdict_event; bootOffset turns its
// monotonic timestamp into wall time.
func decodeVerdictEvent(sample []byte, bootOffset time.Duration) (VerdictEvent, error) {
	raw, err := rawVerdictEvent(sample)
	if err != nil {
		return VerdictEvent{}, err
	}
	return VerdictEvent{
		Time:      time.Unix(0, int64(raw.TsNs)+int64(bootOffset)),
		Ifindex:   int(raw.Ifindex),
		Direction: policy.Direction(raw.Dir),
		Verdict:   policy.Verdict(raw.Verdict),
		Stage:     policy.Stage(raw.Stage),
		Rule:      policy.RuleID(raw.Rule),
		Log:       policy.RuleID(raw.Log),
		Passed:    policy.RuleID(raw.Passed),
		Peer:      policy.Identity(raw.PeerId),
		Src:       netip.AddrPortFrom(addrOfBE32(raw.Saddr), htons(raw.Sport)),
		Dst:       netip.AddrPortFrom(addrOfBE32(raw.Daddr), htons(raw.Dport)),
		Proto:     raw.Proto,
		Service:   serviceOfEvent(raw),
		// LB4_FLOW_CLIENT (bpf/lib/lbflow.h)
		ServiceByClient: raw.SvcMatch == 2,
	}, nil
}

// serviceOfEvent reads the frontend an event names, if any.
func serviceOfEvent(raw lxcVerdictEvent) netip.AddrPort {
	if raw.SvcAddr == 0 {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(addrOfBE32(raw.SvcAddr), htons(raw.SvcPort))
}

// verdictEventSize is sizeof(struct verdict_event).
var verdictEventSize = binary.Size(lxcVerdictEvent{})

// verdictEventSizeNoService is the size of the events of the programs
// before verdict events named the Service (48 bytes): during an upgrade
// the old programs still write into the ring the new agent reads.
const verdictEventSizeNoService = 48

// rawVerdictEvent decodes struct verdict_event (bpf/lib/events.h) by its
// offsets: every new connection has one or two events, and reflection
// (binary.Read) would cost more than the rest of the record's path.
// TestRawVerdictEventMatchesLayout holds the offsets to the generated type.
func rawVerdictEvent(b []byte) (lxcVerdictEvent, error) {
	if len(b) != verdictEventSize && len(b) != verdictEventSizeNoService {
		return lxcVerdictEvent{}, fmt.Errorf("decode verdict event: %d bytes, want %d", len(b), verdictEventSize)
	}
	e := binary.NativeEndian
	ev := lxcVerdictEvent{
		TsNs: e.Uint64(b[0:]), Ifindex: e.Uint32(b[8:]), PeerId: e.Uint32(b[12:]), Rule: e.Uint32(b[16:]),
		Saddr: e.Uint32(b[20:]), Daddr: e.Uint32(b[24:]), Sport: e.Uint16(b[28:]), Dport: e.Uint16(b[30:]),
		Proto: b[32], Dir: b[33], Verdict: b[34], Stage: b[35], Log: e.Uint32(b[36:]), Passed: e.Uint32(b[40:]),
	}
	if len(b) == verdictEventSize {
		ev.SvcAddr, ev.SvcPort, ev.SvcMatch, ev.Pad = e.Uint32(b[44:]), e.Uint16(b[48:]), b[50], b[51]
	}
	return ev, nil
}

// Close stops the reader; a blocked Read returns ErrEventsClosed.
func (r *EventReader) Close() error { return r.ring.rd.Close() }

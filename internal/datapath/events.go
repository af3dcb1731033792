package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/weirnet/weir/internal/policy"
)

// ErrEventsClosed is returned by EventReader.Read after Close.
var ErrEventsClosed = errors.New("event reader closed")

// Verdicts of a VerdictEvent (VERDICT_* in bpf/lib/events.h).
const (
	VerdictAllowed = 1
	VerdictDenied  = 2
)

// VerdictEvent is one policy decision of the datapath: a drop, or the first
// packet of a newly allowed connection.
type VerdictEvent struct {
	Time      time.Time
	Ifindex   int              // host veth of the local endpoint judged
	Direction policy.Direction // of that endpoint
	Verdict   uint8
	Peer      policy.Identity // the peer's label identity
	Rule      policy.RuleID   // 0: no policy enforces (allowed) or none allows (denied)
	Src, Dst  netip.AddrPort
	Proto     uint8
}

// EventReader reads the verdict ring buffer. Only one reader per node.
type EventReader struct {
	rd *ringbuf.Reader
	// bootOffset turns the kernel's monotonic timestamps into wall time.
	bootOffset time.Duration
}

// OpenEventReader starts reading the node's verdict events.
func (n *Node) OpenEventReader() (*EventReader, error) {
	rd, err := ringbuf.NewReader(n.progs.Events)
	if err != nil {
		return nil, fmt.Errorf("open verdict events: %w", err)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		rd.Close()
		return nil, fmt.Errorf("read monotonic clock: %w", err)
	}
	return &EventReader{rd: rd, bootOffset: time.Duration(time.Now().UnixNano() - ts.Nano())}, nil
}

// Read blocks for the next event.
func (r *EventReader) Read() (VerdictEvent, error) {
	rec, err := r.rd.Read()
	if err != nil {
		if errors.Is(err, ringbuf.ErrClosed) {
			return VerdictEvent{}, ErrEventsClosed
		}
		return VerdictEvent{}, fmt.Errorf("read verdict event: %w", err)
	}
	var raw lxcVerdictEvent
	if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &raw); err != nil {
		return VerdictEvent{}, fmt.Errorf("decode verdict event (%d bytes): %w", len(rec.RawSample), err)
	}
	return VerdictEvent{
		Time:      time.Unix(0, int64(raw.TsNs)+int64(r.bootOffset)),
		Ifindex:   int(raw.Ifindex),
		Direction: policy.Direction(raw.Dir),
		Verdict:   raw.Verdict,
		Peer:      policy.Identity(raw.PeerId),
		Rule:      policy.RuleID(raw.Rule),
		Src:       netip.AddrPortFrom(addrOfBE32(raw.Saddr), htons(raw.Sport)),
		Dst:       netip.AddrPortFrom(addrOfBE32(raw.Daddr), htons(raw.Dport)),
		Proto:     raw.Proto,
	}, nil
}

// Close stops the reader; a blocked Read returns ErrEventsClosed.
func (r *EventReader) Close() error { return r.rd.Close() }

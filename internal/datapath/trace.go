package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// ErrTraceUnsupported is returned for a packet Trace cannot build or place.
var ErrTraceUnsupported = errors.New("cannot trace this packet")

// TracePacket is a synthetic first packet of a flow to run through the
// node's programs: a TCP SYN, a UDP datagram or an ICMP echo request.
type TracePacket struct {
	Src, Dst netip.Addr
	Proto    uint8  // 6 (TCP), 17 (UDP) or 1 (ICMP)
	Port     uint16 // destination port; ignored for ICMP
	// SrcIfindex is the host veth of a local source, 0 when the source
	// is not a pod of this node.
	SrcIfindex int
	// DstIfindex is the host veth of a local destination, 0 otherwise.
	DstIfindex int
}

// TraceResult is what the datapath did with a TracePacket.
type TraceResult struct {
	// Program is the entry program the packet was run through.
	Program string
	// TCVerdict is the program's return: "ok", "shot", "redirect" or the
	// number of any other.
	TCVerdict string
	// Events are the verdict events the run emitted, in order: the
	// source's egress, then the destination's ingress, for each local end
	// that was judged.
	Events []VerdictEvent
}

// traceSourcePort is the source port of every traced TCP or UDP packet.
const traceSourcePort = 40999

// privateMaps are the maps a trace instance does not share with the live
// datapath, and the sizes they get: the trace leaves no connection, event
// or counter behind.
var privateMaps = map[string]func(*ebpf.MapSpec) uint32{
	"weir_ct":         func(*ebpf.MapSpec) uint32 { return 64 },
	"weir_ct_any":     func(*ebpf.MapSpec) uint32 { return 64 },
	"weir_ct_revoked": func(*ebpf.MapSpec) uint32 { return 64 },
	"weir_frags":      func(*ebpf.MapSpec) uint32 { return 64 },
	"weir_events":     func(*ebpf.MapSpec) uint32 { return uint32(os.Getpagesize()) },
	"weir_metrics":    func(s *ebpf.MapSpec) uint32 { return s.MaxEntries }, // indexed by metric id
	// Zeroed: the trace emits its events whether or not the node
	// records flows (--flow-events=false).
	"weir_flow_config": func(s *ebpf.MapSpec) uint32 { return s.MaxEntries },
	"weir_verdicts":    func(*ebpf.MapSpec) uint32 { return 64 },
}

// tracePrograms is a second instance of the entry programs: policy,
// ipcache, endpoint and tunnel maps are the node's pinned ones; conntrack,
// events and metrics are its own.
type tracePrograms struct {
	mu            sync.Mutex // one run at a time: runs share ct and events
	fromContainer *ebpf.Program
	toContainer   *ebpf.Program
	fromOverlay   *ebpf.Program
	fromNetdev    *ebpf.Program
	metrics       *ebpf.Map
	// flowState are the private conntrack, revoked-flow and fragment
	// tables, emptied before each run.
	flowState  []*ebpf.Map
	private    []*ebpf.Map // every private map, closed with t
	events     *ringbuf.Reader
	eventsMap  *ebpf.Map
	bootOffset time.Duration
}

// loadTracePrograms loads the trace instance for programs loaded with cfg.
func loadTracePrograms(cfg ProgramConfig) (_ *tracePrograms, retErr error) {
	t := &tracePrograms{}
	defer func() {
		if retErr != nil {
			t.close()
		}
	}()
	spec, err := loadLxc()
	if err != nil {
		return nil, fmt.Errorf("load lxc spec: %w", err)
	}
	repl := map[string]*ebpf.Map{}
	for name, size := range privateMaps {
		ms, ok := spec.Maps[name]
		if !ok {
			return nil, fmt.Errorf("map %s missing from lxc spec", name)
		}
		cp := ms.Copy()
		cp.Pinning, cp.MaxEntries = ebpf.PinNone, size(ms)
		m, err := ebpf.NewMap(cp)
		if err != nil {
			return nil, fmt.Errorf("create private %s: %w", name, err)
		}
		repl[name] = m
		t.private = append(t.private, m)
	}
	t.eventsMap, t.metrics = repl["weir_events"], repl["weir_metrics"]
	t.flowState = []*ebpf.Map{repl["weir_ct"], repl["weir_ct_any"], repl["weir_ct_revoked"], repl["weir_frags"]}
	if t.events, err = ringbuf.NewReader(t.eventsMap); err != nil {
		return nil, fmt.Errorf("read private events: %w", err)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return nil, fmt.Errorf("read monotonic clock: %w", err)
	}
	t.bootOffset = time.Duration(time.Now().UnixNano() - ts.Nano())

	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: cfg.PinDir}, MapReplacements: repl}
	cfg.senderFromCB = true
	consts := cfg.constants()
	var lxc struct {
		FromContainer *ebpf.Program `ebpf:"from_container"`
		ToContainer   *ebpf.Program `ebpf:"to_container"`
	}
	if err := loadPrivatized(loadLxc, repl, consts, &lxc, opts); err != nil {
		return nil, fmt.Errorf("load trace from_container: %w", err)
	}
	t.fromContainer, t.toContainer = lxc.FromContainer, lxc.ToContainer
	var ov struct {
		FromOverlay *ebpf.Program `ebpf:"from_overlay"`
	}
	if err := loadPrivatized(loadOverlay, repl, consts, &ov, opts); err != nil {
		return nil, fmt.Errorf("load trace from_overlay: %w", err)
	}
	t.fromOverlay = ov.FromOverlay
	var host struct {
		FromNetdev *ebpf.Program `ebpf:"from_netdev"`
	}
	if err := loadPrivatized(loadHost, repl, consts, &host, opts); err != nil {
		return nil, fmt.Errorf("load trace from_netdev: %w", err)
	}
	t.fromNetdev = host.FromNetdev
	return t, nil
}

// privatized parses an entry object with the private maps' specs made to
// match their replacements (MapReplacements requires the same size and no
// pin).
func privatized(load func() (*ebpf.CollectionSpec, error), repl map[string]*ebpf.Map) (*ebpf.CollectionSpec, error) {
	spec, err := load()
	if err != nil {
		return nil, err
	}
	for name, m := range repl {
		if ms, ok := spec.Maps[name]; ok {
			ms.Pinning, ms.MaxEntries = ebpf.PinNone, m.MaxEntries()
		}
	}
	return spec, nil
}

// loadPrivatized loads an entry object into to with its private maps
// replaced.
func loadPrivatized(load func() (*ebpf.CollectionSpec, error), repl map[string]*ebpf.Map, consts map[string]uint32, to any, opts *ebpf.CollectionOptions) error {
	spec, err := privatized(load, repl)
	if err != nil {
		return err
	}
	return loadWithConsts(spec, consts, to, opts)
}

func (t *tracePrograms) close() {
	if t.events != nil {
		t.events.Close()
	}
	for _, p := range []*ebpf.Program{t.fromContainer, t.toContainer, t.fromOverlay, t.fromNetdev} {
		if p != nil {
			p.Close()
		}
	}
	for _, m := range t.private {
		m.Close()
	}
}

// Trace runs p through the entry program that would see it first on this
// node, with BPF_PROG_RUN, on a trace instance of the programs: the live
// policy state decides, and no connection, event or counter of the live
// datapath changes. The trace instance is loaded on first use.
func (n *Node) Trace(p TracePacket) (TraceResult, error) {
	t, err := n.tracer()
	if err != nil {
		return TraceResult{}, err
	}
	frame, err := traceFrame(p)
	if err != nil {
		return TraceResult{}, err
	}
	name, prog, ctx := t.pick(n.cfg, n.progs.cfg, p)
	if prog == nil {
		return TraceResult{}, fmt.Errorf("neither %v nor %v is a pod of this node: %w", p.Src, p.Dst, ErrTraceUnsupported)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.reset(); err != nil {
		return TraceResult{}, err
	}
	res := TraceResult{Program: name}
	err = n.do(func() error {
		opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: ctx}
		ret, err := prog.Run(opts)
		if err != nil {
			return fmt.Errorf("run %s: %w", name, err)
		}
		res.TCVerdict = tcVerdictName(ret)
		return nil
	})
	if err != nil {
		return TraceResult{}, err
	}
	if res.Events, err = t.drain(); err != nil {
		return TraceResult{}, err
	}
	return res, nil
}

// tracer returns the node's trace instance, loading it once.
func (n *Node) tracer() (*tracePrograms, error) {
	n.traceMu.Lock()
	defer n.traceMu.Unlock()
	if n.trace != nil {
		return n.trace, nil
	}
	if n.progs == nil {
		return nil, errors.New("trace: the node's programs are not loaded")
	}
	var t *tracePrograms
	err := n.do(func() error {
		var err error
		t, err = loadTracePrograms(n.progs.cfg)
		return err
	})
	if err != nil {
		return nil, err
	}
	n.trace = t
	return t, nil
}

// closeTrace releases the trace instance, if one was loaded.
func (n *Node) closeTrace() {
	n.traceMu.Lock()
	defer n.traceMu.Unlock()
	if n.trace != nil {
		n.trace.close()
		n.trace = nil
	}
}

// pick chooses the program that sees p first: a local source's
// from_container; for a packet from elsewhere to a local pod, the node's
// own to_container, else the overlay's or the underlay's ingress.
func (t *tracePrograms) pick(node NodeConfig, cfg ProgramConfig, p TracePacket) (string, *ebpf.Program, skbCtx) {
	switch {
	case p.SrcIfindex != 0:
		return "from_container", t.fromContainer, skbCtx{IngressIfindex: uint32(p.SrcIfindex)}
	case p.DstIfindex == 0:
		return "", nil, skbCtx{}
	case node.NodeIP.IsValid() && p.Src == node.NodeIP:
		return "to_container", t.toContainer, skbCtx{}
	case cfg.Mode == ModeVXLAN:
		return "from_overlay", t.fromOverlay, skbCtx{IngressIfindex: uint32(cfg.OverlayIfindex)}
	}
	return "from_netdev", t.fromNetdev, skbCtx{}
}

// reset empties the private flow tables and event ring, so every trace
// is a new connection that is judged and reported.
func (t *tracePrograms) reset() error {
	for _, m := range t.flowState {
		if err := clearMap(m); err != nil {
			return fmt.Errorf("clear trace %s: %w", m, err)
		}
	}
	_, err := t.drain()
	return err
}

// clearMap deletes every key of m.
func clearMap(m *ebpf.Map) error {
	var (
		keys [][]byte
		k    = make([]byte, m.KeySize())
		v    = make([]byte, m.ValueSize())
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, append([]byte(nil), k...))
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, key := range keys {
		if err := m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

// drain reads every event in the private ring without blocking.
func (t *tracePrograms) drain() ([]VerdictEvent, error) {
	t.events.SetDeadline(time.Unix(1, 0)) // in the past: never wait
	var (
		out []VerdictEvent
		rec ringbuf.Record
	)
	for {
		err := t.events.ReadInto(&rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read trace events: %w", err)
		}
		ev, err := decodeVerdictEvent(rec.RawSample, t.bootOffset)
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
}

// skbCtx is the head of struct __sk_buff up to cb; BPF_PROG_RUN accepts
// a prefix and copies ingress_ifindex and cb into the test skb.
type skbCtx struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto, Priority uint32
	IngressIfindex                                                                        uint32
	Ifindex                                                                               uint32
	TCIndex                                                                               uint32
	// Cb carries, for copies loaded with senderFromCB, the sending node
	// (cb[0], network order; 0: the owner of the source's CIDR) and its
	// VNI (cb[1]).
	Cb [5]uint32
}

// TC verdicts (linux/pkt_cls.h).
const (
	tcActOK       = 0
	tcActShot     = 2
	tcActRedirect = 7
)

func tcVerdictName(ret uint32) string {
	switch ret {
	case tcActOK:
		return "ok"
	case tcActShot:
		return "shot"
	case tcActRedirect:
		return "redirect"
	}
	return fmt.Sprint(ret)
}

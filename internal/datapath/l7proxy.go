package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// L7ProxySlots is how many connections can be handed to user space at
// once on a node (L7_PROXY_SLOTS, bpf/lib/l7proxy.h).
const L7ProxySlots = 1024

// The states of a slot (l7_handoff.state).
const (
	slotFree   = 0
	slotActive = 1
	slotClosed = 2
)

// L7Proxy is the kernel side of the hand-off to user space
// (bpf/lib/l7proxy.h): the slots through which a connection the kernel
// cannot judge is read and written by a proxy. With no slot open, such a
// connection is closed, as before the proxy existed.
type L7Proxy struct {
	objs *l7Objects
	// mu makes one pair at a time: a pair's two ends must be the two
	// ends of one connection (what Q writes is steered by its peer's
	// port), so no dial may take another's accept.
	mu sync.Mutex
	ln net.Listener
}

// Proxy is the standalone path's hand-off side.
func (s *L7Sockets) Proxy() *L7Proxy { return &L7Proxy{objs: &s.objs} }

// L7Proxy is the node's hand-off side (SetupL7).
func (n *Node) L7Proxy() (*L7Proxy, error) {
	if n.l7objs == nil {
		return nil, errors.New("L7 is not set up on this node")
	}
	return &L7Proxy{objs: n.l7objs}, nil
}

// attachProxyMsg attaches l7_proxy_msg to weir_l7_proxy, before any
// socket joins it (a socket takes the programs its map has when it joins).
func attachProxyMsg(objs *l7Objects) error {
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: objs.WeirL7Proxy.FD(), Program: objs.L7ProxyMsg,
		Attach: ebpf.AttachSkMsgVerdict}); err != nil {
		return fmt.Errorf("attach the proxy's sk_msg program to weir_l7_proxy: %w", err)
	}
	return nil
}

// Reset forgets every slot an earlier proxy offered (its sockets are
// gone with it): the free list is emptied and every record cleared, so a
// connection an earlier proxy served is closed at its next skb (its
// record no longer names it) and no slot is offered twice. For a proxy
// starting, before OpenSlot.
func (p *L7Proxy) Reset() error {
	var slot uint32
	for {
		if err := p.objs.WeirL7Free.LookupAndDelete(nil, &slot); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				break
			}
			return fmt.Errorf("empty the proxy's free slots: %w", err)
		}
	}
	for i := uint32(0); i < L7ProxySlots; i++ {
		if err := p.objs.WeirL7Handoff.Put(i, l7L7Handoff{}); err != nil {
			return fmt.Errorf("clear proxy slot %d: %w", i, err)
		}
	}
	var port uint32
	var ports []uint32
	it := p.objs.WeirL7ProxyPorts.Iterate()
	for it.Next(&port, &slot) {
		ports = append(ports, port)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read the proxy's ports: %w", err)
	}
	for _, port := range ports {
		if err := p.objs.WeirL7ProxyPorts.Delete(port); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("forget a proxy port: %w", err)
		}
	}
	return nil
}

// ProxySlot is one hand-off slot: In (P) receives the request stream of
// the connection handed to it and takes the bytes the proxy allows, which
// reach the server; Answer (Q) takes the answers the proxy sends the
// client in the server's place.
type ProxySlot struct {
	Slot   uint32
	In     *net.TCPConn
	Answer *net.TCPConn
	p      *L7Proxy
}

// OpenSlot makes slot's loopback pair in the calling thread's network
// namespace, puts both ends in weir_l7_proxy and offers the slot to the
// kernel (weir_l7_free). Close gives it up.
func (p *L7Proxy) OpenSlot(slot uint32) (_ *ProxySlot, retErr error) {
	if slot >= L7ProxySlots {
		return nil, fmt.Errorf("proxy slot %d: there are %d", slot, L7ProxySlots)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("listen for the proxy's socket pairs: %w", err)
		}
		p.ln = ln
	}
	in, err := net.DialTimeout("tcp4", p.ln.Addr().String(), 2*time.Second)
	if err != nil {
		return nil, fmt.Errorf("proxy slot %d: %w", slot, err)
	}
	answer, err := p.acceptPeerOf(in)
	if err != nil {
		in.Close()
		return nil, fmt.Errorf("proxy slot %d: %w", slot, err)
	}
	s := &ProxySlot{Slot: slot, In: in.(*net.TCPConn), Answer: answer.(*net.TCPConn), p: p}
	defer func() {
		if retErr != nil {
			s.Close()
		}
	}()
	if err := p.objs.WeirL7Handoff.Put(slot, l7L7Handoff{}); err != nil {
		return nil, fmt.Errorf("proxy slot %d: clear its record: %w", slot, err)
	}
	if err := s.Read(0); err != nil {
		return nil, err
	}
	for i, c := range []*net.TCPConn{s.In, s.Answer} {
		if err := putSocket(p.objs.WeirL7Proxy, slot*2+uint32(i), c); err != nil {
			return nil, fmt.Errorf("proxy slot %d: %w", slot, err)
		}
	}
	port := uint32(s.In.LocalAddr().(*net.TCPAddr).Port)
	if err := p.objs.WeirL7ProxyPorts.Put(port, slot); err != nil {
		return nil, fmt.Errorf("proxy slot %d: record its port: %w", slot, err)
	}
	if err := p.objs.WeirL7Free.Update(nil, slot, ebpf.UpdateAny); err != nil {
		return nil, fmt.Errorf("proxy slot %d: offer it: %w", slot, err)
	}
	return s, nil
}

// acceptPeerOf accepts in's other end. Whatever else reached the
// loopback listener first (another process of the node's namespace) is
// closed: a pair made of two connections would steer one connection's
// answers into another.
func (p *L7Proxy) acceptPeerOf(in net.Conn) (net.Conn, error) {
	for range 8 {
		c, err := p.ln.Accept()
		if err != nil {
			return nil, err
		}
		if c.RemoteAddr().String() == in.LocalAddr().String() {
			return c, nil
		}
		c.Close()
	}
	return nil, errors.New("the pair's listener keeps accepting strangers")
}

// putSocket puts c in a socket map under key.
func putSocket(m *ebpf.Map, key uint32, c *net.TCPConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var putErr error
	if err := raw.Control(func(fd uintptr) { putErr = m.Put(key, uint64(fd)) }); err != nil {
		return err
	}
	if putErr != nil {
		return fmt.Errorf("put socket %d in %s: %w", key, m, putErr)
	}
	return nil
}

// Handoff is the connection a slot serves, as the kernel handed it.
type Handoff struct {
	// Active: the slot serves a connection; Closed: it closed (or the
	// proxy ended it), recycle the slot once Redirected bytes are read.
	Active, Closed bool
	Cookie         uint64
	// Server is the server's socket's address (its pod), Client its peer.
	Server, Client netip.AddrPort
	// Sets are the kernel HTTP sets its requests are judged against.
	Sets [3]uint32
	// Prefix bytes at the start of the stream were allowed by the kernel.
	Prefix uint32
	// Owes: the server had not answered the last request the kernel let
	// go when it handed the connection; SeqOwed is how far it had written.
	Owes    bool
	SeqOwed uint32
	// Redirected counts the bytes sent to the proxy.
	Redirected uint64
	// H2 says the connection speaks HTTP/2 (h2c) and was handed whole:
	// what its server sends comes to the slot's Answer socket, and the
	// proxy ends HTTP/2 on both sides.
	H2 bool
	// Egress: the connection is a local client's, handed by its
	// socket's message verdict and judged by the client's egress policy:
	// what the proxy allows goes out on the client's socket, its answers
	// into that socket's receive queue, and the marks (SeqAt) hold how
	// far the client had received rather than how far the server had
	// written.
	Egress bool
	marks  []seqMark
	key    l7L7SockKey
}

type seqMark struct {
	offset uint64
	seq    uint32
}

// Handoff reads the slot's record.
func (s *ProxySlot) Handoff() (Handoff, error) {
	var h l7L7Handoff
	if err := s.p.objs.WeirL7Handoff.Lookup(s.Slot, &h); err != nil {
		return Handoff{}, fmt.Errorf("read proxy slot %d: %w", s.Slot, err)
	}
	out := Handoff{
		Active: h.State == slotActive, Closed: h.State == slotClosed, Cookie: h.Cookie,
		Server: netip.AddrPortFrom(addrOfBE32(h.Key.Local), h.Key.LocalPort),
		Client: netip.AddrPortFrom(addrOfBE32(h.Key.Remote), h.Key.RemotePort),
		Sets:   h.Sets, Prefix: h.Prefix, Owes: h.Owes != 0, SeqOwed: h.SeqOwed,
		Redirected: h.Redirected, H2: h.H2 != 0, Egress: h.Egress != 0, key: h.Key,
	}
	for _, m := range h.Marks {
		if m.Valid != 0 {
			out.marks = append(out.marks, seqMark{m.Offset, m.Seq})
		}
	}
	return out, nil
}

// FlowSets are the HTTP sets the connection is restricted to now, as
// the kernel's verdict reads them for every skb (weir_l7_flows, which
// policy rewrites when it changes): false when its entry is gone, which
// closes a connection.
func (s *ProxySlot) FlowSets(h Handoff) ([3]uint32, bool, error) {
	if h.Egress {
		return s.outSets(h)
	}
	var f l7L7Flow
	err := s.p.objs.WeirL7Flows.Lookup(h.key, &f)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return [3]uint32{}, false, nil
	}
	if err != nil {
		return [3]uint32{}, false, fmt.Errorf("read the HTTP sets of handed connection %v: %w", h.Client, err)
	}
	return f.Sets, true, nil
}

// outSets reads a handed client connection's sets from its weir_l7_out
// entry, keyed as its socket names it; an entry of another socket (the
// four-tuple reused) is none.
func (s *ProxySlot) outSets(h Handoff) ([3]uint32, bool, error) {
	var f l7L7OutFlow
	err := s.p.objs.WeirL7Out.Lookup(clientView(h.key), &f)
	if errors.Is(err, ebpf.ErrKeyNotExist) || (err == nil && f.Cookie != h.Cookie) {
		return [3]uint32{}, false, nil
	}
	if err != nil {
		return [3]uint32{}, false, fmt.Errorf("read the HTTP sets of handed client connection %v: %w", h.Client, err)
	}
	return f.Sets, true, nil
}

// clientView is a connection's key as its client's socket names it (the
// server as remote): l7_server_view's inverse, the same swap.
func clientView(k l7L7SockKey) l7L7SockKey {
	return l7L7SockKey{Remote: k.Local, Local: k.Remote, RemotePort: k.LocalPort, LocalPort: k.RemotePort}
}

// SeqAt is how far the server had written when the skb holding stream
// offset off arrived; false when the slot no longer remembers it.
func (h Handoff) SeqAt(off uint64) (uint32, bool) {
	best := -1
	for i, m := range h.marks {
		if m.offset <= off && (best < 0 || m.offset > h.marks[best].offset) {
			best = i
		}
	}
	if best < 0 {
		return 0, false // that skb's mark was written over
	}
	return h.marks[best].seq, true
}

// End stops the slot's connection: the kernel drops its later bytes
// and the connection is reset once the server has sent what it owes
// (write sequence seq, when haveSeq; owes: the server has an answer
// still to write), as the kernel's own closes are (ResetClosedL7).
func (s *ProxySlot) End(h Handoff, haveSeq bool, seq uint32, owes bool) error {
	var rec l7L7Handoff
	if err := s.p.objs.WeirL7Handoff.Lookup(s.Slot, &rec); err != nil {
		return fmt.Errorf("end proxy slot %d: %w", s.Slot, err)
	}
	if rec.Cookie != h.Cookie || rec.State != slotActive {
		return nil // closed already, or serving another connection
	}
	rec.State = slotClosed
	if err := s.p.objs.WeirL7Handoff.Put(s.Slot, rec); err != nil {
		return fmt.Errorf("end proxy slot %d: %w", s.Slot, err)
	}
	now, err := monotonicNow()
	if err != nil {
		return err
	}
	// Not knowing how far the server had written, wait out the grace
	// rather than cut an answer it still owes. A client's socket is
	// reset after the grace too: what its server still owes comes in,
	// and no mark says when it has.
	e := l7L7Closing{SinceNs: now, Local: rec.Key.Local, Flags: closingGrace}
	if rec.Egress != 0 {
		e.Local = rec.Key.Remote
	}
	if haveSeq && rec.Egress == 0 {
		e.Seq = seq
		e.Flags = closingSeq
		if owes {
			e.Flags |= closingOwes
		}
	}
	if err := s.p.objs.WeirL7Closing.Update(h.Cookie, e, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("list a handed connection for reset: %w", err)
	}
	return nil
}

// The flags of a weir_l7_closing entry (L7_CLOSING_*, bpf/lib/l7reset.h).
const (
	closingSeq   = 1
	closingOwes  = 2
	closingGrace = 4
)

// Read tells the kernel how many bytes of its connection's stream the
// slot has read: the kernel closes a connection whose stream runs
// L7_PROXY_BACKLOG (4 MiB) ahead of it (the proxy cannot keep up, and
// S's receive window no longer holds the client back).
func (s *ProxySlot) Read(n uint64) error {
	if err := s.p.objs.WeirL7ProxyRead.Put(s.Slot, n); err != nil {
		return fmt.Errorf("proxy slot %d: note what it read: %w", s.Slot, err)
	}
	return nil
}

// Close gives the slot up: its sockets leave weir_l7_proxy and close. A
// connection it served is closed by the kernel (its redirects fail), and
// a later pop of the slot from weir_l7_free finds no socket and closes
// that connection too: fail closed.
func (s *ProxySlot) Close() error {
	var errs []error
	if s.In != nil {
		port := uint32(s.In.LocalAddr().(*net.TCPAddr).Port)
		if err := s.p.objs.WeirL7ProxyPorts.Delete(port); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
		errs = append(errs, s.In.Close())
	}
	if s.Answer != nil {
		errs = append(errs, s.Answer.Close())
	}
	return errors.Join(errs...)
}

// Close closes the listener the slots' pairs were made with.
func (p *L7Proxy) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		return nil
	}
	return p.ln.Close()
}

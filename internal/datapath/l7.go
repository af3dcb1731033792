package datapath

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/weirnet/weir/internal/l7"
)

// L7Mode is how the inbound bytes of an L7-enforced port's sockets reach
// the verdict program (bpf/lib/l7sock.h).
type L7Mode uint8

// The modes, as weir_l7_ports stores them.
const (
	// L7StrParser: the kernel's strparser assembles each message (a
	// request head, once the parser names its length) before the verdict.
	L7StrParser L7Mode = 1
	// L7SkbVerdict: the verdict sees each skb as TCP delivers it.
	L7SkbVerdict L7Mode = 2
	// L7HTTP: the skb verdict reads each request and judges it against
	// the port's HTTP set (EnforceHTTP).
	L7HTTP L7Mode = 3
)

func (m L7Mode) String() string {
	switch m {
	case L7StrParser:
		return "strparser"
	case L7SkbVerdict:
		return "skb-verdict"
	case L7HTTP:
		return "http"
	}
	return fmt.Sprintf("L7Mode(%d)", uint8(m))
}

// L7Stats are the L7 socket path's counters, summed over CPUs.
type L7Stats struct {
	Sockets  uint64 // accepted sockets that joined a socket hash
	JoinFail uint64 // sockets a full hash (or reader state map) refused
	Messages uint64 // messages (strparser) or skbs judged
	Bytes    uint64 // bytes judged
	Allowed  uint64 // requests allowed
	Denied   uint64 // requests denied
	Refused  uint64 // streams refused (400)
	Punted   uint64 // heads the kernel cannot judge
	Split    uint64 // heads that did not end in the skb they began in
	Answered uint64 // answers written back in place
	Closed   uint64 // connections whose later bytes are all dropped
	NoState  uint64 // skbs of a socket without reader state, dropped
	// EventsLost are request records a full ring lost (the requests
	// were judged all the same).
	EventsLost uint64
	// Pipelined are denials not answered in place because the answer
	// to an earlier request was still to come: their connections closed.
	Pipelined uint64
	// Reset are closed connections reset once their answers went out
	// (ResetClosedL7).
	Reset uint64
	// ResetUnlisted are closed connections a full weir_l7_closing left
	// to their peers' timeouts.
	ResetUnlisted uint64
	// Handed are connections handed to user space (L7Proxy).
	Handed uint64
	// ProxyForwarded are bytes the proxy wrote back into servers'
	// sockets, ProxyAnswered the answers it sent in their place.
	ProxyForwarded, ProxyAnswered uint64
	// ProxyBehind are handed connections closed because the proxy fell
	// 4 MiB behind their stream.
	ProxyBehind uint64
	// Clients are client sockets that joined the egress reader
	// (weir_l7_client); Corked are messages it held for the rest of a
	// head they ended in the middle of; SendDesync are client
	// connections it closed because TCP took other bytes than it judged
	// (a send taken in part, sends interleaved by threads, bytes written
	// before the join).
	Clients, Corked, SendDesync uint64
	// Replies are answers to allowed requests whose status was read;
	// RepliesLost are connections whose answers are no longer read
	// (bpf/lib/l7reply.h: a client that pipelines, a send that does not
	// begin an answer, a 101, a connection handed to user space).
	Replies, RepliesLost uint64
	// H2C are HTTP/2 cleartext connections handed whole to user space;
	// H2CServerBytes the bytes their servers sent, steered into the
	// proxy (bpf/lib/l7proxy.h).
	H2C, H2CServerBytes uint64
}

// L7Sockets is a standalone L7 socket path (bpf/l7.c) with maps of its
// own, for benches and tests: accepted sockets on the ports given to
// EnforcePort or EnforceHTTP, or recorded in the flows map it was given,
// in the cgroup it is attached to, have their inbound bytes read by the
// verdict programs. A node's own path is Node.SetupL7's.
type L7Sockets struct {
	objs    l7Objects
	sockops link.Link
	// key is the reader's hash key, random for each L7Sockets: rule
	// sets must be compiled under it (HashKey).
	key    l7.HashKey
	tables l7Tables
}

// L7FlowMaps are where tc records the connections policy restricts to
// HTTP rules: In (weir_l7_flows, Programs.L7Flows) those a server's
// ingress rules restrict, Out (weir_l7_out, Programs.L7Out) those a
// client's egress rules do. A nil map is the programs' own.
type L7FlowMaps struct {
	In, Out *ebpf.Map
}

// AttachL7Sockets loads bpf/l7.c, attaches its parser and verdicts to its
// socket hashes and its sock_ops program to the cgroup v2 directory
// cgroup. flows are the node's flow maps, or the programs' own (for
// ports given a set with EnforceHTTP, and tests that record flows
// themselves). Close detaches everything: a socket still in a hash
// leaves it, and what its queue held unread is lost (l7sock.h), so close
// the enforced connections first.
func AttachL7Sockets(cgroup string, flows L7FlowMaps) (_ *L7Sockets, retErr error) {
	s := &L7Sockets{}
	spec, err := loadL7()
	if err != nil {
		return nil, fmt.Errorf("parse the L7 socket programs: %w", err)
	}
	// Maps of their own, none pinned: the node's are SetupL7's.
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	if s.key, err = newHTTPHashKey(); err != nil {
		return nil, err
	}
	if err := setHTTPHashKey(spec, s.key); err != nil {
		return nil, err
	}
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{}}
	if flows.In != nil {
		opts.MapReplacements["weir_l7_flows"] = flows.In
	}
	if flows.Out != nil {
		opts.MapReplacements["weir_l7_out"] = flows.Out
	}
	if err := spec.LoadAndAssign(&s.objs, opts); err != nil {
		return nil, fmt.Errorf("load the L7 socket programs: %w", err)
	}
	defer func() {
		if retErr != nil {
			s.Close()
		}
	}()
	for _, a := range []struct {
		m    *ebpf.Map
		p    *ebpf.Program
		kind ebpf.AttachType
	}{
		{s.objs.WeirL7Strp, s.objs.L7Parser, ebpf.AttachSkSKBStreamParser},
		{s.objs.WeirL7Strp, s.objs.L7Verdict, ebpf.AttachSkSKBStreamVerdict},
		{s.objs.WeirL7Skb, s.objs.L7SkbVerdict, ebpf.AttachSkSKBVerdict},
	} {
		if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: a.m.FD(), Program: a.p, Attach: a.kind}); err != nil {
			return nil, fmt.Errorf("attach %v to its socket hash: %w", a.kind, err)
		}
	}
	if err := attachServerReader(&s.objs); err != nil {
		return nil, err
	}
	if err := attachProxyMsg(&s.objs); err != nil {
		return nil, err
	}
	if err := attachClientReader(&s.objs); err != nil {
		return nil, err
	}
	if s.tables, err = openL7Tables(s.objs.WeirL7Match, s.objs.WeirL7Sets, s.objs.WeirL7HeaderWatch, s.objs.WeirL7Dfa); err != nil {
		return nil, err
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: ebpf.AttachCGroupSockOps, Program: s.objs.L7Sockops})
	if err != nil {
		return nil, fmt.Errorf("attach the L7 sock_ops program to %s: %w", cgroup, err)
	}
	s.sockops = l
	return s, nil
}

// EnforcePort sends the sockets accepted on port (of processes in the
// cgroup) from now on through mode's verdict. Sockets accepted before
// stay on the plain path.
func (s *L7Sockets) EnforcePort(port uint16, mode L7Mode) error {
	if mode != L7StrParser && mode != L7SkbVerdict {
		return fmt.Errorf("L7 mode %v: want %v or %v (%v takes a set: EnforceHTTP)", mode, L7StrParser, L7SkbVerdict, L7HTTP)
	}
	if err := s.objs.WeirL7Ports.Put(port, l7L7Port{Mode: uint8(mode)}); err != nil {
		return fmt.Errorf("enforce L7 on port %d: %w", port, err)
	}
	return nil
}

// RestrictClient restricts the connection client opens to server to the
// HTTP sets sets, judged on the client's socket by its egress reader
// (lib/l7client.h) as tc restricts one a client's egress policy allows
// only through HTTP rules, recording it when it allows the SYN. For the
// standalone path: call it before the client connects, from a process
// in the path's cgroup (sock_ops joins the socket at its handshake). A
// connection already recorded keeps its socket and judged mark: only
// its sets change, as a policy change changes them, and its next
// request is judged against them.
func (s *L7Sockets) RestrictClient(client, server netip.AddrPort, sets [3]uint32) error {
	if !client.Addr().Is4() || !server.Addr().Is4() {
		return fmt.Errorf("restrict %v to %v: IPv4 only", client, server)
	}
	key := l7L7SockKey{Remote: be32(server.Addr()), Local: be32(client.Addr()), RemotePort: server.Port(), LocalPort: client.Port()}
	var f l7L7OutFlow
	if err := s.objs.WeirL7Out.Lookup(key, &f); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("restrict %v to %v: %w", client, server, err)
	}
	f.Sets = sets
	if err := s.objs.WeirL7Out.Put(key, f); err != nil {
		return fmt.Errorf("restrict %v to %v: %w", client, server, err)
	}
	return nil
}

// ClientJudged reads the judged mark of a connection RestrictClient
// restricted: the sequence number after the last byte its client's
// socket may send.
func (s *L7Sockets) ClientJudged(client, server netip.AddrPort) (uint32, error) {
	var f l7L7OutFlow
	key := l7L7SockKey{Remote: be32(server.Addr()), Local: be32(client.Addr()), RemotePort: server.Port(), LocalPort: client.Port()}
	if err := s.objs.WeirL7Out.Lookup(key, &f); err != nil {
		return 0, fmt.Errorf("the flow of %v to %v: %w", client, server, err)
	}
	return f.Judged, nil
}

// EnforceHTTP judges the requests of sockets accepted on port from now on
// against HTTP set set, which WriteHTTPSet must have written (a set not
// written denies every request), and the next requests of those open on
// it too, as a policy change does.
func (s *L7Sockets) EnforceHTTP(port uint16, set uint32) error {
	if set == 0 {
		return errors.New("HTTP set 0 is no set: number sets from 1")
	}
	if err := s.objs.WeirL7Ports.Put(port, l7L7Port{Mode: uint8(L7HTTP), Set: set}); err != nil {
		return fmt.Errorf("enforce HTTP rules on port %d: %w", port, err)
	}
	var (
		k    l7L7SockKey
		f    l7L7Flow
		open []l7L7SockKey
	)
	it := s.objs.WeirL7Flows.Iterate()
	for it.Next(&k, &f) {
		if k.LocalPort == port {
			open = append(open, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("find the connections open on port %d: %w", port, err)
	}
	for _, k := range open {
		if err := s.objs.WeirL7Flows.Lookup(k, &f); err != nil {
			continue // closed meanwhile
		}
		f.Sets = [3]uint32{set}
		if err := s.objs.WeirL7Flows.Update(k, f, ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("restrict a connection open on port %d: %w", port, err)
		}
	}
	return nil
}

// WriteHTTPSet writes HTTP set id for EnforceHTTP's ports.
func (s *L7Sockets) WriteHTTPSet(id uint32, k *l7.KernelRules) error {
	if k.Key != s.key {
		return fmt.Errorf("HTTP set %d: %w", id, errHashKey)
	}
	return s.tables.writeSet(id, k)
}

// HashKey is the key the path's reader hashes under: compile the sets
// written to it with l7.CompileKernel(rules, s.HashKey()).
func (s *L7Sockets) HashKey() l7.HashKey { return s.key }

// errHashKey is a rule set compiled under another key than the reader's:
// no request would ever match it.
var errHashKey = errors.New("compiled under another hash key than the reader's (use HashKey)")

// newHTTPHashKey is a fresh random key.
func newHTTPHashKey() (l7.HashKey, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return l7.HashKey{}, fmt.Errorf("make the HTTP hash key: %w", err)
	}
	return l7.HashKey{binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])}, nil
}

// setHTTPHashKey sets the reader's key (lib/http.h) in spec before load.
func setHTTPHashKey(spec *ebpf.CollectionSpec, key l7.HashKey) error {
	for i, name := range []string{"HTTP_HASH_KEY0", "HTTP_HASH_KEY1"} {
		v, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("the L7 programs have no %s", name)
		}
		if err := v.Set(key[i]); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	return nil
}

// DeleteHTTPSet removes set id: requests judged against it are denied.
func (s *L7Sockets) DeleteHTTPSet(id uint32, k *l7.KernelRules) error {
	return s.tables.deleteSet(id, k)
}

// HTTPConnections is the number of sockets with reader state: it goes
// down as they close.
func (s *L7Sockets) HTTPConnections() (int, error) {
	n := 0
	var k uint64
	var v []byte
	it := s.objs.WeirL7Conns.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	return n, it.Err()
}

// ReleasePort leaves new sockets accepted on port on the plain path.
func (s *L7Sockets) ReleasePort(port uint16) error {
	if err := s.objs.WeirL7Ports.Delete(port); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("release port %d from L7: %w", port, err)
	}
	return nil
}

// Stats sums the path's per-CPU counters.
func (s *L7Sockets) Stats() (L7Stats, error) {
	return readL7Stats(s.objs.WeirL7Stats)
}

// readL7Stats sums weir_l7_stats over CPUs.
func readL7Stats(m *ebpf.Map) (L7Stats, error) {
	var out L7Stats
	fields := []*uint64{&out.Sockets, &out.JoinFail, &out.Messages, &out.Bytes, &out.Allowed, &out.Denied,
		&out.Refused, &out.Punted, &out.Split, &out.Answered, &out.Closed, &out.NoState, &out.EventsLost, &out.Pipelined,
		&out.Reset, &out.ResetUnlisted, &out.Handed, &out.ProxyForwarded, &out.ProxyAnswered, &out.ProxyBehind,
		&out.Clients, &out.Corked, &out.SendDesync, &out.Replies, &out.RepliesLost, &out.H2C, &out.H2CServerBytes}
	for i, f := range fields {
		var perCPU []uint64
		if err := m.Lookup(uint32(i), &perCPU); err != nil {
			return out, fmt.Errorf("read L7 counter %d: %w", i, err)
		}
		for _, v := range perCPU {
			*f += v
		}
	}
	return out, nil
}

// Close detaches the sock_ops program and frees the programs and maps.
func (s *L7Sockets) Close() error {
	var errs []error
	if s.sockops != nil {
		errs = append(errs, s.sockops.Close())
	}
	errs = append(errs, s.objs.Close())
	return errors.Join(errs...)
}

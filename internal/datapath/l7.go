package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
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
)

func (m L7Mode) String() string {
	switch m {
	case L7StrParser:
		return "strparser"
	case L7SkbVerdict:
		return "skb-verdict"
	}
	return fmt.Sprintf("L7Mode(%d)", uint8(m))
}

// L7Stats are the L7 socket path's counters, summed over CPUs.
type L7Stats struct {
	Sockets  uint64 // accepted sockets that joined a socket hash
	JoinFail uint64 // sockets a full hash refused (left on the L4 path)
	Messages uint64 // messages (strparser) or skbs judged
	Bytes    uint64 // bytes judged
}

// L7Sockets is the L7 socket path (bpf/l7.c): accepted sockets on the
// ports given to EnforcePort, in the cgroup it is attached to, have their
// inbound bytes judged by the verdict programs. Today's verdicts pass
// everything: this is the path whose cost decides issue 20's design.
type L7Sockets struct {
	objs    l7Objects
	sockops link.Link
}

// AttachL7Sockets loads bpf/l7.c, attaches its parser and verdicts to its
// socket hashes and its sock_ops program to the cgroup v2 directory
// cgroup. Close detaches everything: a socket still in a hash leaves it,
// and what its queue held unread is lost (l7sock.h), so close the
// enforced connections first.
func AttachL7Sockets(cgroup string) (_ *L7Sockets, retErr error) {
	s := &L7Sockets{}
	if err := loadL7Objects(&s.objs, nil); err != nil {
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
		return fmt.Errorf("L7 mode %v: want %v or %v", mode, L7StrParser, L7SkbVerdict)
	}
	if err := s.objs.WeirL7Ports.Put(port, uint8(mode)); err != nil {
		return fmt.Errorf("enforce L7 on port %d: %w", port, err)
	}
	return nil
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
	var out L7Stats
	fields := []*uint64{&out.Sockets, &out.JoinFail, &out.Messages, &out.Bytes}
	for i, f := range fields {
		var perCPU []uint64
		if err := s.objs.WeirL7Stats.Lookup(uint32(i), &perCPU); err != nil {
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

package datapath

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// policySeq is weir_policy_seq (bpf/lib/policy.h) mapped into the
// agent's memory: it counts the writes to the maps a policy decision
// reads, so the datapath can tell a decision read from one state from one
// that straddled two writes.
type policySeq struct {
	mu    sync.Mutex // one write at a time: the count marks the one under way
	mem   []byte
	count *atomic.Uint32
}

// mapPolicySeq maps the counter of m, an mmapable array of one __u32.
func mapPolicySeq(m *ebpf.Map) (*policySeq, error) {
	mem, err := unix.Mmap(m.FD(), 0, os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map weir_policy_seq into memory: %w", err)
	}
	return &policySeq{mem: mem, count: (*atomic.Uint32)(unsafe.Pointer(&mem[0]))}, nil
}

// write counts one write, then makes it with f. The count goes first:
// a decision that read the count before it and again after the write
// landed sees a different number and reads again.
func (s *policySeq) write(f func() error) error {
	if s == nil {
		return f()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.count.Add(1)
	return f()
}

func (s *policySeq) close() {
	if s != nil && s.mem != nil {
		unix.Munmap(s.mem)
		s.mem, s.count = nil, nil
	}
}

// writePolicyMap makes one write to a map a policy decision reads
// (weir_ep_policy, weir_policy, weir_ipcache, weir_cidr_ids).
func (n *Node) writePolicyMap(f func() error) error {
	err := n.progs.policySeq.write(f)
	if n.afterWrite != nil {
		n.afterWrite()
	}
	return err
}

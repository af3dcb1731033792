package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// l7ClosingStale is how long a socket may stay listed for reset after the
// kernel's own grace (L7_RESET_GRACE_NS, 5 s) before a sweep that did not
// find it forgets it: a socket that left without its close being seen.
const l7ClosingStale = 30 * time.Second

// L7ResetPending says whether a socket the HTTP verdict closed waits for
// its reset (ResetClosedL7): one map read, for a caller polling often.
func (n *Node) L7ResetPending() bool {
	return n.l7objs != nil && l7ResetPending(n.l7objs.WeirL7Closing)
}

// ResetClosedL7 resets the connections the node's HTTP verdict has closed
// (bpf/lib/l7reset.h) whose last answers have gone out: it reads the
// reset iterator in the namespace netnsOf names for each listed socket's
// local address. A socket whose address no namespace holds (its pod is
// gone) is forgotten. It returns how many sockets still wait: their
// answers are still going out, so call it again shortly.
func (n *Node) ResetClosedL7(netnsOf func(netip.Addr) (string, bool)) (int, error) {
	if n.l7objs == nil {
		return 0, errors.New("L7 is not set up on this node")
	}
	return resetClosedL7(n.l7objs, netnsOf)
}

// ResetClosed is ResetClosedL7 for a standalone path whose sockets are
// all in the namespace at netnsPath.
func (s *L7Sockets) ResetClosed(netnsPath string) (int, error) {
	return resetClosedL7(&s.objs, func(netip.Addr) (string, bool) { return netnsPath, true })
}

func l7ResetPending(closing *ebpf.Map) bool {
	var k uint64
	return closing.NextKey(nil, &k) == nil
}

// resetClosedL7 sweeps each namespace holding a listed socket once, then
// forgets what no sweep can reach, and counts what is left.
func resetClosedL7(objs *l7Objects, netnsOf func(netip.Addr) (string, bool)) (int, error) {
	listed, err := listClosing(objs.WeirL7Closing)
	if err != nil || len(listed) == 0 {
		return 0, err
	}
	var (
		errs   []error
		forget []uint64
		swept  = map[string]bool{}
	)
	for addr, cookies := range groupByLocal(listed) {
		path, ok := netnsOf(addr)
		if ok && !swept[path] {
			err := readIteratorsIn(path, objs.L7ResetTcp)
			swept[path] = true
			if errors.Is(err, ErrNetNSNotFound) {
				ok = false
			} else if err != nil {
				errs = append(errs, fmt.Errorf("reset closed HTTP connections: %w", err))
			}
		}
		if !ok {
			forget = append(forget, cookies...)
		}
	}
	now, err := monotonicNow()
	if err != nil {
		return 0, err
	}
	for c, e := range listed {
		if now-e.SinceNs > uint64(5*time.Second+l7ClosingStale) {
			forget = append(forget, c)
		}
	}
	for _, c := range forget {
		if err := objs.WeirL7Closing.Delete(c); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("forget a closed HTTP connection: %w", err))
		}
	}
	left, err := listClosing(objs.WeirL7Closing)
	if err != nil {
		errs = append(errs, err)
	}
	return len(left), errors.Join(errs...)
}

func listClosing(m *ebpf.Map) (map[uint64]l7L7Closing, error) {
	out, err := readMap[uint64, l7L7Closing](m)
	if err != nil {
		return nil, fmt.Errorf("list closed HTTP connections: %w", err)
	}
	return out, nil
}

func groupByLocal(listed map[uint64]l7L7Closing) map[netip.Addr][]uint64 {
	out := map[netip.Addr][]uint64{}
	for c, e := range listed {
		a := addrOfBE32(e.Local)
		out[a] = append(out[a], c)
	}
	return out
}

// readIteratorsIn reads progs, socket iterators, in the namespace at
// path: an iterator walks the sockets of the namespace it is read in.
func readIteratorsIn(path string, progs ...*ebpf.Program) error {
	netns, err := getNS(path)
	if err != nil {
		return err
	}
	defer netns.Close()
	return netns.Do(func(ns.NetNS) error {
		for _, prog := range progs {
			if err := readIterator(prog); err != nil {
				return fmt.Errorf("in %s: %w", path, err)
			}
		}
		return nil
	})
}

func monotonicNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read monotonic clock: %w", err)
	}
	return uint64(ts.Nano()), nil
}

package datapath

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// GCRevokedFlows deletes the records of revoked flows (weir_ct_revoked,
// bpf/lib/conntrack.h) that saw no packet for idle, and returns how many
// it deleted. The datapath refreshes a record each time it drops one of
// the flow's packets, so a revoked flow that keeps trying stays recorded;
// one that went quiet is forgotten, and its next packet is judged as a
// new flow (a TCP segment that is no SYN is then dropped as flowless).
func (n *Node) GCRevokedFlows(idle time.Duration) (int, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read monotonic clock: %w", err)
	}
	now := uint64(ts.Nano())
	var (
		k     lxcCtKey
		last  uint64
		stale []lxcCtKey
	)
	it := n.progs.CTRevoked.Iterate()
	for it.Next(&k, &last) {
		if last+uint64(idle) < now {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("iterate revoked flows: %w", err)
	}
	deleted := 0
	var errs []error
	for _, k := range stale {
		switch err := n.progs.CTRevoked.Delete(&k); {
		case err == nil:
			deleted++
		case !errors.Is(err, ebpf.ErrKeyNotExist):
			errs = append(errs, fmt.Errorf("delete revoked flow: %w", err))
		}
	}
	return deleted, errors.Join(errs...)
}

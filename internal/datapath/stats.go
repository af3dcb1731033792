package datapath

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ProgramNames are the names Weir's packet programs carry in the kernel.
var ProgramNames = []string{"from_container", "from_overlay", "to_overlay", "from_netdev"}

// SocketProgramNames are the names of the programs a new TCP connection
// from a pod runs besides the packet programs: the connect translation,
// the sockops program that notes the Service at the handshake, and the
// release hook.
var SocketProgramNames = []string{"sock4_connect", "sock_tcp_ops", "sock_released"}

// ProgramStat is the kernel's run-time accounting for one program name,
// summed over every loaded instance (every node of a lab).
type ProgramStat struct {
	RunCount uint64
	RunTime  time.Duration
}

// EnableRunTimeStats turns on the kernel's per-program run-time statistics
// (kernel.bpf_stats_enabled) until the returned closer is closed.
func EnableRunTimeStats() (io.Closer, error) {
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enable BPF run-time statistics: %w", err)
	}
	return c, nil
}

// ProgramStats reads the run count and run time of every loaded program
// carrying one of names.
func ProgramStats(names []string) (map[string]ProgramStat, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]ProgramStat{}
	var id ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, ebpf.ErrNotSupported) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list programs: %w", err)
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // unloaded meanwhile
		}
		info, err := p.Info()
		if err != nil || !want[info.Name] {
			p.Close()
			continue
		}
		st, err := p.Stats()
		p.Close()
		if err != nil {
			return nil, fmt.Errorf("stats of %s: %w", info.Name, err)
		}
		s := out[info.Name]
		s.RunCount += st.RunCount
		s.RunTime += st.Runtime
		out[info.Name] = s
	}
}

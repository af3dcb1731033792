package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/weirnet/weir/internal/datapath/bpffs"
)

// ErrPreflight is wrapped by the error of a preflight check that failed.
var ErrPreflight = errors.New("kernel feature missing")

// CheckPrograms names the check that loads Weir's programs: the slowest,
// and the one that leaves the kernel's verifier to judge.
const CheckPrograms = "datapath programs"

// Check is one thing Weir needs of a node's kernel, and what breaks
// without it.
type Check struct {
	Name string
	// Needed says what Weir uses it for: what breaks when it is missing.
	Needed string
	// Required checks fail the preflight; the others only warn.
	Required bool
	Probe    func() error
}

// CheckResult is a Check and what its probe found: Err nil when the
// feature is there.
type CheckResult struct {
	Name     string `json:"name"`
	Needed   string `json:"needed"`
	Required bool   `json:"required"`
	OK       bool   `json:"ok"`
	Problem  string `json:"problem,omitempty"`
}

// PreflightPaths are the kernel's files the checks read; tests point them
// at files of their own to simulate a kernel without a feature.
type PreflightPaths struct {
	BTF       string // the kernel's own BTF
	JIT       string // the bpf_jit_enable sysctl
	Conntrack string // present when the conntrack module is loaded
	MountInfo string // this process's mounts
}

// DefaultPreflightPaths are the real kernel's.
var DefaultPreflightPaths = PreflightPaths{
	BTF:       "/sys/kernel/btf/vmlinux",
	JIT:       "/proc/sys/net/core/bpf_jit_enable",
	Conntrack: "/proc/sys/net/netfilter/nf_conntrack_max",
	MountInfo: "/proc/self/mountinfo",
}

// PreflightChecks are the checks of a node that is to run Weir in mode,
// in the order they depend on each other: the BPF syscall first, the
// programs themselves after what they need.
func PreflightChecks(p PreflightPaths, mode Mode) []Check {
	return []Check{
		{Name: "bpf syscall", Required: true, Needed: "every part of the datapath: nothing of Weir runs without it (CONFIG_BPF_SYSCALL, and root or CAP_BPF+CAP_NET_ADMIN)",
			Probe: func() error { return features.HaveProgramType(ebpf.SchedCLS) }},
		{Name: "bpf jit", Required: false, Needed: "speed: without the JIT every packet runs through the BPF interpreter, several times slower (CONFIG_BPF_JIT, net.core.bpf_jit_enable=1)",
			Probe: func() error { return probeJIT(p.JIT) }},
		{Name: "btf", Required: true, Needed: "the datapath's programs: they read conntrack entries through CO-RE relocations against the kernel's BTF (CONFIG_DEBUG_INFO_BTF)",
			Probe: func() error { return probeReadable(p.BTF) }},
		{Name: "conntrack", Required: true, Needed: "policy beside the stack's NAT (masquerade, hostPorts, kube-proxy): the programs ask conntrack whether the stack translated a flow (CONFIG_NF_CONNTRACK, module nf_conntrack loaded)",
			Probe: func() error { return probeReadable(p.Conntrack) }},
		{Name: "bpffs", Required: true, Needed: "pinned maps and links: without them an agent restart loses connection tracking and detaches the datapath (CONFIG_BPF_SYSCALL, /sys/fs/bpf)",
			Probe: probeBPFFS},
		{Name: "cgroup v2", Required: true, Needed: "Service translation at the socket: ClusterIPs, NodePorts from the node (CONFIG_CGROUP_BPF, a cgroup2 mount or the right to make one)",
			Probe: func() error { return probeCgroup2(p.MountInfo) }},
		{Name: CheckPrograms, Required: true, Needed: "everything: Weir's own eBPF programs must pass this kernel's verifier, with the helpers, kfuncs and map types they use",
			Probe: probePrograms},
		{Name: "tcx", Required: true, Needed: "attaching the datapath to pod and node devices (Linux 6.6 or later, CONFIG_NET_XGRESS)",
			Probe: func() error { return inThrowawayNetns(probeTCX) }},
		{Name: "vxlan", Required: mode == ModeVXLAN, Needed: "--mode=vxlan, the default, between nodes (CONFIG_VXLAN); --mode=native works without it",
			Probe: func() error { return inThrowawayNetns(probeVXLAN) }},
	}
}

// RunPreflight runs the checks in order. A check whose probe panics or
// fails is reported, never skipped.
func RunPreflight(checks []Check) []CheckResult {
	out := make([]CheckResult, 0, len(checks))
	for _, c := range checks {
		r := CheckResult{Name: c.Name, Needed: c.Needed, Required: c.Required, OK: true}
		if err := probe(c.Probe); err != nil {
			r.OK, r.Problem = false, err.Error()
		}
		out = append(out, r)
	}
	return out
}

// probe runs p, turning a panic into its error.
func probe(p func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the check panicked: %v", r)
		}
	}()
	return p()
}

// PreflightError is nil when every required check passed, and otherwise
// names each that failed.
func PreflightError(results []CheckResult) error {
	var missing []string
	for _, r := range results {
		if r.Required && !r.OK {
			missing = append(missing, r.Name)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %w", strings.Join(missing, ", "), ErrPreflight)
}

// probeJIT reads bpf_jit_enable: 1 (on) or 2 (on, with debug output).
// The sysctl lives only in the host's network namespace; elsewhere (a
// node's namespace, a pod on the node's network after setns) it asks the
// kernel instead whether it compiled a program it just loaded.
func probeJIT(path string) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return probeJITByProgram()
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	switch v := strings.TrimSpace(string(b)); v {
	case "1", "2":
		return nil
	default:
		return fmt.Errorf("%s is %s: the JIT is off", path, v)
	}
}

// probeJITByProgram loads the smallest socket filter and reads its
// JIT-compiled size: none means the kernel interprets it.
func probeJITByProgram() error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		return fmt.Errorf("load a trial program to see whether the kernel compiles it: %w", err)
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		return fmt.Errorf("read the trial program's info: %w", err)
	}
	if _, err := info.JitedSize(); err != nil {
		return fmt.Errorf("the kernel did not compile a trial program (bpf_jit_enable, in the host's network namespace, is 0?): %w", err)
	}
	return nil
}

// probeReadable reports whether the kernel exposes path.
func probeReadable(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}

// probeBPFFS makes and removes a directory on the bpf filesystem,
// mounting it where it is not (and taking a mount it made away again).
func probeBPFFS() error {
	dir, err := bpffs.MkdirTemp("weir-preflight-")
	if err != nil {
		return err
	}
	rmErr := os.Remove(dir)
	if err := bpffs.Release(); err != nil {
		return err
	}
	if rmErr != nil {
		return fmt.Errorf("remove %s: %w", dir, rmErr)
	}
	return nil
}

// probeCgroup2 finds a cgroup v2 hierarchy, or checks that one can be
// mounted: mounts it at a temporary place and unmounts it again.
func probeCgroup2(mountinfo string) error {
	root, err := findCgroup2(mountinfo)
	if err != nil || root != "" {
		return err
	}
	dir, err := os.MkdirTemp("", "weir-preflight-cgroup2-")
	if err != nil {
		return fmt.Errorf("no cgroup2 mount, and no place to try one: %w", err)
	}
	defer os.Remove(dir)
	if err := unix.Mount("cgroup2", dir, "cgroup2", 0, ""); err != nil {
		return fmt.Errorf("no cgroup2 mount, and mounting one failed: %w", err)
	}
	if err := unix.Unmount(dir, 0); err != nil {
		return fmt.Errorf("unmount the trial cgroup2 at %s: %w", dir, err)
	}
	return nil
}

// probePrograms loads every program of the datapath, as the agent would,
// with its maps pinned in a temporary bpffs directory, and unloads them.
func probePrograms() (retErr error) {
	dir, err := bpffs.MkdirTemp("weir-preflight-")
	if err != nil {
		return err
	}
	defer func() {
		if err := os.RemoveAll(dir); err != nil && retErr == nil {
			retErr = fmt.Errorf("remove %s: %w", dir, err)
		}
		if err := bpffs.Release(); err != nil && retErr == nil {
			retErr = err
		}
	}()
	// Both modes, with kube-proxy replacement: the load-time constants
	// prune what a configuration does not use, so each must pass.
	for i, mode := range []Mode{ModeVXLAN, ModeNative} {
		pins := filepath.Join(dir, string(mode))
		if err := os.Mkdir(pins, 0o755); err != nil {
			return err
		}
		p, err := LoadPrograms(ProgramConfig{Mode: mode, OverlayIfindex: 1 - i, PinDir: pins, ExternalServices: true,
			PodCIDR: netip.MustParsePrefix("10.244.0.0/24"), ClusterCIDR: netip.MustParsePrefix("10.244.0.0/16")})
		if err != nil {
			return fmt.Errorf("%s mode: %w", mode, err)
		}
		p.Close()
	}
	return nil
}

// inThrowawayNetns runs f in a new network namespace, which goes when f
// returns: what f makes there cannot touch the node's own devices. f runs
// on a goroutine of its own, locked to its thread, and the thread is never
// unlocked: Go ends it with the goroutine instead of running anything else
// in the scratch namespace, whatever failed.
func inThrowawayNetns(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		scratch, err := vns.New()
		if err != nil {
			errc <- fmt.Errorf("make a throwaway network namespace: %w", err)
			return
		}
		defer scratch.Close()
		errc <- f()
	}()
	return <-errc
}

// probeTCX attaches a program to the tcx ingress of the throwaway
// namespace's loopback (every namespace has one; a dummy device needs a
// module not every kernel has).
func probeTCX() error {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.LoadImm(asm.R0, 0, asm.DWord), asm.Return()}})
	if err != nil {
		return fmt.Errorf("load a trivial tc program: %w", err)
	}
	defer prog.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: lo.Index, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return fmt.Errorf("attach to tcx ingress: %w", err)
	}
	return l.Close()
}

// probeVXLAN makes a VXLAN device like the overlay's.
func probeVXLAN() error {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "weirpf1"}, VtepDevIndex: lo.Index, Port: 8472, Learning: false}
	if err := netlink.LinkAdd(vx); err != nil {
		return fmt.Errorf("make a vxlan device: %w", err)
	}
	return nil
}

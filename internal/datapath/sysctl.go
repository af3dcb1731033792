package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// nodeSysctls are what pod networking needs from the node's namespace.
// Strict reverse-path filtering would drop replies that come back through
// a different device than the one the stack would route them out of (the
// overlay versus a veth), so it is turned off as Cilium does.
var nodeSysctls = map[string]string{
	"net/ipv4/ip_forward":             "1",
	"net/ipv4/conf/all/rp_filter":     "0",
	"net/ipv4/conf/default/rp_filter": "0",
}

// setNodeSysctls writes nodeSysctls for the calling thread's namespace.
func setNodeSysctls() error {
	for k, v := range nodeSysctls {
		if err := writeSysctl(k, v); err != nil {
			return err
		}
	}
	return nil
}

func writeSysctl(name, value string) error {
	p := filepath.Join("/proc/sys", name)
	if cur, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(cur)) == value {
		return nil
	}
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("set sysctl %s=%s: %w", strings.ReplaceAll(name, "/", "."), value, err)
	}
	return nil
}

// bpffsMagic is BPF_FS_MAGIC from linux/magic.h.
const bpffsMagic = 0xcafe4a11

// ErrNotBPFFS is returned when a pin directory is not on a bpf filesystem
// and one cannot be mounted there.
var ErrNotBPFFS = errors.New("not a bpf filesystem")

// EnsureBPFFS makes sure dir lies on a bpf filesystem, mounting one at
// /sys/fs/bpf (or at dir itself, outside /sys/fs/bpf) when none is there,
// and creates dir. It reports whether it mounted one.
func EnsureBPFFS(dir string) (mounted bool, _ error) {
	root := dir
	if strings.HasPrefix(dir, "/sys/fs/bpf/") {
		root = "/sys/fs/bpf"
	}
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil || uint32(st.Type) != bpffsMagic {
		if err := os.MkdirAll(root, 0o700); err != nil {
			return false, fmt.Errorf("create %s: %w", root, err)
		}
		if err := unix.Mount("bpffs", root, "bpf", 0, "mode=0700"); err != nil {
			return false, fmt.Errorf("mount bpffs at %s: %w (%w)", root, err, ErrNotBPFFS)
		}
		mounted = true
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return mounted, fmt.Errorf("create %s: %w", dir, err)
	}
	return mounted, nil
}

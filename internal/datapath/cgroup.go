package datapath

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// DefaultCgroupRoot is where Weir mounts a cgroup v2 hierarchy when the
// machine has none (a cgroup v1 boot without the unified hierarchy).
const DefaultCgroupRoot = "/run/weir/cgroup2"

// ErrNoCgroup2 is returned when no cgroup v2 hierarchy can be found or mounted.
var ErrNoCgroup2 = errors.New("no cgroup v2 hierarchy")

// EnsureCgroup2 returns the root of the machine's cgroup v2 hierarchy. There
// is only one per machine, however often it is mounted; when it is not
// mounted anywhere it is mounted at DefaultCgroupRoot, and mounted says so,
// for a caller that must undo it.
func EnsureCgroup2() (root string, mounted bool, _ error) {
	if root, err := findCgroup2("/proc/self/mountinfo"); err != nil || root != "" {
		return root, false, err
	}
	if err := os.MkdirAll(DefaultCgroupRoot, 0o755); err != nil {
		return "", false, fmt.Errorf("create %s: %w", DefaultCgroupRoot, err)
	}
	if err := unix.Mount("cgroup2", DefaultCgroupRoot, "cgroup2", 0, ""); err != nil {
		return "", false, fmt.Errorf("mount cgroup2 at %s: %w (%w)", DefaultCgroupRoot, err, ErrNoCgroup2)
	}
	return DefaultCgroupRoot, true, nil
}

// findCgroup2 returns the first cgroup2 mount point in a mountinfo file
// whose root is the hierarchy's root, or "" when there is none.
func findCgroup2(mountinfo string) (string, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return "", fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source super
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, fs := strings.Fields(pre), strings.Fields(post)
		if len(fields) >= 5 && len(fs) >= 1 && fs[0] == "cgroup2" && fields[3] == "/" {
			return fields[4], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read mounts: %w", err)
	}
	return "", nil
}

// attachCgroupPinned attaches prog to the cgroup at path and pins the link,
// or updates the program of a link already pinned there, atomically, so a
// restarted agent never leaves sockets untranslated.
func attachCgroupPinned(prog *ebpf.Program, path string, at ebpf.AttachType, pin string) error {
	if old, err := link.LoadPinnedLink(pin, nil); err == nil {
		defer old.Close()
		if err := old.Update(prog); err == nil {
			return nil
		}
		if err := old.Unpin(); err != nil {
			return fmt.Errorf("unpin stale link %s: %w", pin, err)
		}
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: path, Attach: at, Program: prog})
	if err != nil {
		return fmt.Errorf("attach %v to cgroup %s: %w", at, path, err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		return fmt.Errorf("pin link %s: %w", pin, err)
	}
	return nil
}

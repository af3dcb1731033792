package datapath

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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

// ErrNotMachineCgroup is returned for a cgroup v2 directory that is not
// the machine's root: socket programs attached there would translate the
// sockets of only the processes below it.
var ErrNotMachineCgroup = errors.New("not the machine's cgroup v2 root")

// checkMachineCgroupRoot fails unless dir is the root of the machine's
// cgroup v2 hierarchy. A cgroup2 mounted inside a cgroup namespace (a
// container's, unless it is privileged) has the container's own cgroup as
// its root, and looks like a root from inside; but only the real root
// cgroup lacks cgroup.type, which every other cgroup has.
func checkMachineCgroupRoot(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("cgroup root %s: %w", dir, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return fmt.Errorf("cgroup root %s is not on a cgroup v2 filesystem: %w", dir, ErrNoCgroup2)
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.type")); err == nil {
		return fmt.Errorf("cgroup root %s is a cgroup below the machine's root (mounted inside a cgroup namespace?): "+
			"mount cgroup2 from the machine's cgroup namespace (the chart's mount-fs init container does) and pass it as --cgroup-root: %w", dir, ErrNotMachineCgroup)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cgroup root %s: %w", dir, err)
	}
	return nil
}

// MountCgroup2 makes dir a mount of the machine's cgroup v2 hierarchy
// unless it is one already, and checks that its root is the machine's.
// The chart's privileged init container calls it, in the machine's
// cgroup namespace, for an agent that runs in a namespace of its own.
func MountCgroup2(dir string) (mounted bool, _ error) {
	is, err := isFSRoot(dir, unix.CGROUP2_SUPER_MAGIC)
	if err != nil {
		return false, err
	}
	if !is {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return false, fmt.Errorf("create %s: %w", dir, err)
		}
		if err := unix.Mount("cgroup2", dir, "cgroup2", 0, ""); err != nil {
			return false, fmt.Errorf("mount cgroup2 at %s: %w (%w)", dir, err, ErrNoCgroup2)
		}
		mounted = true
	}
	if err := checkMachineCgroupRoot(dir); err != nil {
		if mounted {
			unix.Unmount(dir, unix.MNT_DETACH)
		}
		return false, err
	}
	return mounted, nil
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

// Package bpffs mounts the BPF filesystem that pinned maps and programs
// live on, and removes a mount Weir made once nothing but the kernel's own
// files is left on it.
//
// A node agent, a lab, a benchmark and a test run may all need the mount,
// in one process or several, and finish in any order: the first to mount
// it records that in a marker file, and whichever finishes last with the
// mount empty takes it away. An flock serialises the two, so a mount is
// never removed between another process finding it and pinning there.
// A mount Weir did not make (systemd's, or the test script's) is never
// touched.
package bpffs

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Root is where the BPF filesystem is mounted on every Linux host.
const Root = "/sys/fs/bpf"

// The lock and the marker live on /run, a tmpfs: a reboot forgets both,
// as it forgets the mount. Tests point all three elsewhere.
var (
	root       = Root
	lockPath   = "/run/weir-bpffs.lock"
	markerPath = "/run/weir-bpffs.mounted"
)

// ErrNotBPFFS is returned when a pin directory is not on a bpf filesystem
// and one cannot be mounted there.
var ErrNotBPFFS = errors.New("not a bpf filesystem")

// magic is BPF_FS_MAGIC from linux/magic.h.
const magic = 0xcafe4a11

// Ensure makes sure dir lies on a bpf filesystem, mounting one at Root
// (or at dir itself, outside Root) when none is there, and creates dir.
// It reports whether it mounted one.
func Ensure(dir string) (mounted bool, _ error) {
	unlock, err := lock()
	if err != nil {
		return false, err
	}
	defer unlock()
	return ensureLocked(dir)
}

// Require creates dir on a bpf filesystem that is already mounted (at
// Root, for a dir below it), and mounts none: for an agent whose own
// mount would live in its container's mount namespace and take every pin
// with it when the container goes. ErrNotBPFFS says none is there.
func Require(dir string) error {
	at := dir
	if dir == root || strings.HasPrefix(dir, root+"/") {
		at = root
	}
	if !isBPFFS(at) {
		return fmt.Errorf("%s is not on a bpf filesystem, and this agent mounts none (its mount would go with its container, and the pins with it): "+
			"mount bpffs there on the node (the chart's mount-fs init container does), or run the agent with --mount-bpffs: %w", at, ErrNotBPFFS)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	return nil
}

// MkdirTemp makes a new directory with a random name (os.MkdirTemp's
// pattern) on the bpf filesystem at Root, mounting it if need be. The
// caller removes it, then calls Release.
func MkdirTemp(pattern string) (string, error) {
	unlock, err := lock()
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := ensureLocked(root); err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp(root, pattern)
	if err != nil {
		return "", fmt.Errorf("bpffs at %s not writable: %w", root, err)
	}
	return dir, nil
}

func ensureLocked(dir string) (mounted bool, _ error) {
	at := dir
	if dir == root || strings.HasPrefix(dir, root+"/") {
		at = root
	}
	if !isBPFFS(at) {
		if err := os.MkdirAll(at, 0o700); err != nil {
			return false, fmt.Errorf("create %s: %w", at, err)
		}
		if err := unix.Mount("bpffs", at, "bpf", 0, "mode=0700"); err != nil {
			return false, fmt.Errorf("mount bpffs at %s: %w (%w)", at, err, ErrNotBPFFS)
		}
		mounted = true
		if at == root {
			if err := os.WriteFile(markerPath, nil, 0o600); err != nil {
				unix.Unmount(at, 0)
				return false, fmt.Errorf("record the bpffs mount: %w", err)
			}
		}
	}
	// Created under the lock: a Release in another process sees it.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return mounted, fmt.Errorf("create %s: %w", dir, err)
	}
	return mounted, nil
}

// Release unmounts Root if Weir mounted it and nothing but the kernel's
// own files is left on it. It is safe to call when others still pin
// there (it then leaves the mount) and when Weir never mounted it.
func Release() error {
	unlock, err := lock()
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := os.Stat(markerPath); errors.Is(err, os.ErrNotExist) {
		return nil // not ours
	}
	if !isBPFFS(root) {
		return os.Remove(markerPath) // someone else took it away
	}
	if !Unused() {
		return nil
	}
	if err := unix.Unmount(root, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmount bpffs at %s: %w", root, err)
	}
	return os.Remove(markerPath)
}

// Unused reports whether Root holds nothing but the files the kernel
// itself puts on every bpffs mount (the preloaded iterators).
func Unused() bool {
	ents, err := os.ReadDir(root)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if e.Name() != "maps.debug" && e.Name() != "progs.debug" {
			return false
		}
	}
	return true
}

func isBPFFS(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && uint32(st.Type) == magic
}

// lock takes the machine-wide lock over mounting and unmounting.
func lock() (unlock func(), _ error) {
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open bpffs lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", lockPath, err)
	}
	return func() { f.Close() }, nil
}

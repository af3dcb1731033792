package bpffs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// sandbox points the package at a private root, lock and marker, so the
// test never touches the machine's /sys/fs/bpf, and unmounts whatever is
// left mounted at the end.
func sandbox(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("needs root (mount) and CI=true: failing, not skipping")
		}
		t.Skip("needs root (mount)")
	}
	dir := t.TempDir()
	oldRoot, oldLock, oldMarker := root, lockPath, markerPath
	root, lockPath, markerPath = filepath.Join(dir, "bpf"), filepath.Join(dir, "lock"), filepath.Join(dir, "marker")
	t.Cleanup(func() {
		for isBPFFS(root) {
			if err := unix.Unmount(root, 0); err != nil {
				t.Errorf("unmount %s: %v", root, err)
				break
			}
		}
		root, lockPath, markerPath = oldRoot, oldLock, oldMarker
	})
	return root
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// Two users of a mount Weir made: whichever releases last takes it away,
// not the one that mounted it.
func TestLastReleaseUnmounts(t *testing.T) {
	r := sandbox(t)
	first := filepath.Join(r, "lab-a", "n1")
	mounted, err := Ensure(first)
	if err != nil || !mounted {
		t.Fatalf("first Ensure: mounted=%v err=%v, want a new mount", mounted, err)
	}
	if !isBPFFS(r) || !exists(markerPath) {
		t.Fatalf("after mounting: bpffs=%v marker=%v", isBPFFS(r), exists(markerPath))
	}
	second, err := MkdirTemp("weirtest-")
	if err != nil {
		t.Fatal(err)
	}
	if mounted, err := Ensure(filepath.Join(r, "lab-b")); err != nil || mounted {
		t.Fatalf("Ensure on the existing mount: mounted=%v err=%v, want reuse", mounted, err)
	}
	// The one that mounted leaves first: others still pin there.
	if err := os.RemoveAll(filepath.Join(r, "lab-a")); err != nil {
		t.Fatal(err)
	}
	if err := Release(); err != nil {
		t.Fatal(err)
	}
	if !isBPFFS(r) {
		t.Fatal("released while lab-b and a test directory were on it")
	}
	os.RemoveAll(second)
	os.RemoveAll(filepath.Join(r, "lab-b"))
	if err := Release(); err != nil {
		t.Fatal(err)
	}
	if isBPFFS(r) || exists(markerPath) {
		t.Fatalf("after the last release: bpffs=%v marker=%v, want both gone", isBPFFS(r), exists(markerPath))
	}
	// Releasing again, with nothing mounted, is harmless.
	if err := Release(); err != nil {
		t.Fatal(err)
	}
}

// A mount someone else made (systemd, the test script) is never taken
// away, even when empty.
func TestReleaseLeavesForeignMount(t *testing.T) {
	r := sandbox(t)
	if err := os.MkdirAll(r, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpffs", r, "bpf", 0, "mode=0700"); err != nil {
		t.Fatal(err)
	}
	if mounted, err := Ensure(filepath.Join(r, "x")); err != nil || mounted {
		t.Fatalf("Ensure: mounted=%v err=%v", mounted, err)
	}
	os.Remove(filepath.Join(r, "x"))
	if err := Release(); err != nil {
		t.Fatal(err)
	}
	if !isBPFFS(r) {
		t.Fatal("a mount Weir did not make was removed")
	}
}

// Outside the root, the mount goes on the directory itself, and nothing
// records it: its owner unmounts it.
func TestEnsureOutsideRoot(t *testing.T) {
	sandbox(t)
	dir := filepath.Join(t.TempDir(), "pins")
	mounted, err := Ensure(dir)
	if err != nil || !mounted {
		t.Fatalf("Ensure(%s): mounted=%v err=%v", dir, mounted, err)
	}
	defer unix.Unmount(dir, 0)
	if !isBPFFS(dir) || exists(markerPath) {
		t.Fatalf("bpffs at %s: %v, marker %v (want mounted, no marker)", dir, isBPFFS(dir), exists(markerPath))
	}
	if _, err := Ensure("/proc/self/nope/x"); err == nil {
		t.Fatal("Ensure of an impossible directory succeeded")
	}
}

// Require mounts nothing: without a bpf filesystem at the root it fails
// with ErrNotBPFFS and leaves the root as it was; once one is mounted it
// creates the directory on it.
func TestRequireMountsNothing(t *testing.T) {
	r := sandbox(t)
	dir := filepath.Join(r, "weir", "n1")
	if err := os.MkdirAll(r, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Require(dir); !errors.Is(err, ErrNotBPFFS) {
		t.Fatalf("Require without bpffs: %v, want ErrNotBPFFS", err)
	}
	if isBPFFS(r) || exists(dir) {
		t.Fatal("Require mounted or created something")
	}
	if err := unix.Mount("bpffs", r, "bpf", 0, "mode=0700"); err != nil {
		t.Fatal(err)
	}
	if err := Require(dir); err != nil || !exists(dir) {
		t.Fatalf("Require on a mounted bpffs: %v (created: %v)", err, exists(dir))
	}
	os.RemoveAll(filepath.Join(r, "weir"))
}

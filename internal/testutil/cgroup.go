package testutil

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Cgroup2 mounts the machine's cgroup v2 hierarchy for the test (the
// machine boots cgroup v1) and makes a cgroup below its root. Both go
// when the test ends: the cgroup once the processes in it are reaped
// (cleanups run last-in first-out, so helpers started after it are
// killed first), then the mount.
func Cgroup2(t testing.TB) (root, cg string) {
	t.Helper()
	root = filepath.Join(t.TempDir(), "cgroup2")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("cgroup2", root, "cgroup2", 0, ""); err != nil {
		Unavailable(t, "mount cgroup2 at %s: %v", root, err)
	}
	cg, err := os.MkdirTemp(root, "weir-test-")
	if err != nil {
		unix.Unmount(root, unix.MNT_DETACH)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 0; i < 100; i++ {
			if err := os.Remove(cg); err == nil || os.IsNotExist(err) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := unix.Unmount(root, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", root, err)
		}
	})
	return root, cg
}

package datapath

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/weirnet/weir/internal/testutil"
)

// TestMountCgroup2TellsTheMachineRootFromACgroupBelowIt: MountCgroup2
// mounts the machine's hierarchy where there is none, takes a mount that
// is there already, and the check the agent makes before attaching its
// socket programs refuses any cgroup below the root, which is what the
// root of a cgroup2 mounted inside a cgroup namespace is.
func TestMountCgroup2TellsTheMachineRootFromACgroupBelowIt(t *testing.T) {
	testutil.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "cgroup2")
	mounted, err := MountCgroup2(dir)
	if err != nil || !mounted {
		t.Fatalf("MountCgroup2(%s) = %v, %v; want a new mount", dir, mounted, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	if again, err := MountCgroup2(dir); err != nil || again {
		t.Fatalf("MountCgroup2 on its own mount = %v, %v; want it taken as it is", again, err)
	}
	if err := checkMachineCgroupRoot(dir); err != nil {
		t.Fatalf("the machine's root refused: %v", err)
	}

	child, err := os.MkdirTemp(dir, "weirtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(child) })
	if err := checkMachineCgroupRoot(child); !errors.Is(err, ErrNotMachineCgroup) {
		t.Fatalf("a cgroup below the root: %v, want ErrNotMachineCgroup", err)
	}
	if err := checkMachineCgroupRoot(t.TempDir()); !errors.Is(err, ErrNoCgroup2) {
		t.Fatalf("a plain directory: %v, want ErrNoCgroup2", err)
	}
}

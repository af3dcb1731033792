package testutil

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"golang.org/x/sys/unix"
)

// NewNS creates a throwaway network namespace, closed and removed when
// the test ends.
func NewNS(t testing.TB) ns.NetNS {
	t.Helper()
	RequireRoot(t)
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		n.Close()
		testutils.UnmountNS(n)
	})
	return n
}

// BPFDir creates a directory on bpffs for a test's pins and removes it,
// with everything pinned inside, when the test ends.
func BPFDir(t testing.TB) string {
	t.Helper()
	RequireRoot(t)
	// hack/test.sh mounts bpffs for the whole run (and unmounts it after);
	// a test run on its own mounts it here and leaves it, as systemd would.
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/bpf", &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		if err := unix.Mount("bpffs", "/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
			Unavailable(t, "no bpf filesystem at /sys/fs/bpf and mounting one failed: %v", err)
		}
	}
	dir, err := os.MkdirTemp("/sys/fs/bpf", "weirtest-")
	if err != nil {
		Unavailable(t, "bpffs not writable (mount it with `mount -t bpf bpffs /sys/fs/bpf`): %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "node")
}

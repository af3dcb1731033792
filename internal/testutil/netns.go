package testutil

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/weirnet/weir/internal/datapath/bpffs"
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
// with everything pinned inside, when the test ends; a bpffs mount made
// for it goes when the last user of it on the machine is done.
func BPFDir(t testing.TB) string {
	t.Helper()
	RequireRoot(t)
	dir, err := bpffs.MkdirTemp("weirtest-")
	if err != nil {
		Unavailable(t, "no usable bpf filesystem at %s (mount one with `mount -t bpf bpffs %s`): %v", bpffs.Root, bpffs.Root, err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove test pins: %v", err)
		}
		if err := bpffs.Release(); err != nil {
			t.Errorf("release bpffs: %v", err)
		}
	})
	return filepath.Join(dir, "node")
}

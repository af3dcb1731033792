package datapath

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/weirnet/weir/internal/datapath/bpffs"
	"github.com/weirnet/weir/internal/testutil"
)

// TestPreflightPassesHere: this machine has everything Weir needs, so
// every check passes, and the checks leave nothing behind: no directory
// on the bpf filesystem, no device in the node's namespace.
func TestPreflightPassesHere(t *testing.T) {
	testutil.RequireRoot(t)
	before := preflightLeftovers(t)
	results := RunPreflight(PreflightChecks(DefaultPreflightPaths, ModeVXLAN))
	for _, r := range results {
		if !r.OK {
			t.Errorf("%s: %s", r.Name, r.Problem)
		}
	}
	if err := PreflightError(results); err != nil {
		t.Errorf("PreflightError = %v", err)
	}
	if len(results) != 9 {
		t.Errorf("%d checks ran, want 9", len(results))
	}
	if after := preflightLeftovers(t); after != before {
		t.Errorf("left behind: %q (before: %q)", after, before)
	}
}

// TestPreflightJITOutsideTheHostNamespace: in a network namespace other
// than the host's, where bpf_jit_enable does not exist, the JIT check asks
// the kernel whether it compiled a trial program instead of warning.
func TestPreflightJITOutsideTheHostNamespace(t *testing.T) {
	testutil.RequireRoot(t)
	err := inThrowawayNetns(func() error {
		if _, err := os.Stat(DefaultPreflightPaths.JIT); !os.IsNotExist(err) {
			return fmt.Errorf("%s in a new network namespace: %v, want it absent", DefaultPreflightPaths.JIT, err)
		}
		return probeJIT(DefaultPreflightPaths.JIT)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// preflightLeftovers lists what a check could leave: its bpffs
// directories and its devices in this namespace.
func preflightLeftovers(t *testing.T) string {
	t.Helper()
	var left []string
	if entries, err := os.ReadDir(bpffs.Root); err == nil {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "weir-preflight-") {
				left = append(left, e.Name())
			}
		}
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "weirpf") {
			left = append(left, l.Attrs().Name)
		}
	}
	return strings.Join(left, " ")
}

// TestPreflightReportsAPanic: a check that panics is a failed check, not
// a crashed preflight.
func TestPreflightReportsAPanic(t *testing.T) {
	r := RunPreflight([]Check{{Name: "x", Required: true, Probe: func() error { panic("boom") }}})
	if len(r) != 1 || r[0].OK || !strings.Contains(r[0].Problem, "boom") || PreflightError(r) == nil {
		t.Fatalf("results %+v", r)
	}
}

package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/lab"
	"github.com/weirnet/weir/internal/testutil"
)

// binDir holds the binaries built for this run.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		if testutil.InCI() {
			fmt.Fprintln(os.Stderr, "e2e: CI=true but not root: the end-to-end tests need root")
			return 1
		}
		fmt.Fprintln(os.Stderr, "e2e: skipped, needs root")
		return 0
	}
	dir, err := os.MkdirTemp("", "weir-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// Static, because the Kubernetes lab puts them into container images.
	build := exec.Command("go", "build", "-trimpath", "-ldflags", versionLDFlags(), "-o", dir, "../../cmd/weir", "../../cmd/weir-agent", "../../cmd/weir-cni", "../../cmd/weir-pause")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: build binaries:", err)
		return 1
	}
	binDir = dir
	return m.Run()
}

// versionLDFlags stamp the commit the binaries are built from, as
// hack/deps.sh's weir_build does (an upgrade test tells releases apart by
// it); none outside a git checkout.
func versionLDFlags() string {
	const pkg = "github.com/weirnet/weir/internal/version"
	rev, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return ""
	}
	when, err := exec.Command("git", "log", "-1", "--format=%cI").Output()
	if err != nil {
		return ""
	}
	flags := fmt.Sprintf("-X %s.commit=%s -X %s.commitTime=%s", pkg, strings.TrimSpace(string(rev)), pkg, strings.TrimSpace(string(when)))
	if dirty, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(strings.TrimSpace(string(dirty))) > 0 {
		flags += fmt.Sprintf(" -X %s.modified=true", pkg)
	}
	return flags
}

// labCounter gives every lab of this run its own name.
var labCounter int

// newLab brings up a lab that is torn down when the test ends.
func newLab(t *testing.T, nodes, pods int, mode datapath.Mode) *lab.State {
	t.Helper()
	labCounter++
	name := fmt.Sprintf("we2e%d-%d", os.Getpid()%1000, labCounter)
	t.Cleanup(func() {
		if err := lab.Down(context.Background(), name, io.Discard); err != nil {
			t.Errorf("lab down: %v", err)
		}
		if left, _ := filepath.Glob("/var/run/netns/" + name + "-*"); len(left) > 0 {
			t.Errorf("lab down left namespaces: %v", left)
		}
	})
	st, err := lab.Up(context.Background(), lab.Config{Name: name, Nodes: nodes, PodsPerNode: pods, Mode: mode, BinDir: binDir}, io.Discard)
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	return st
}

package lab

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGitCommitSaysDirtyOutsideExclusions: the commit of a tree, marked
// dirty by a change to a tracked file unless the file is excluded.
func TestGitCommitSaysDirtyOutsideExclusions(t *testing.T) {
	dir := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.email=t@t", "-c", "user.name=t"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q")
	for _, f := range []string{"code.go", "results/r.json"} {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755)
		os.WriteFile(filepath.Join(dir, f), []byte("a"), 0o644)
	}
	git("add", ".")
	git("commit", "-qm", "x")
	clean := GitCommit(dir)
	if len(clean) != 12 || strings.HasSuffix(clean, "-dirty") {
		t.Fatalf("clean tree: %q", clean)
	}
	os.WriteFile(filepath.Join(dir, "results/r.json"), []byte("b"), 0o644)
	if got := GitCommit(dir, "results"); got != clean {
		t.Errorf("only excluded results changed: %q, want %q", got, clean)
	}
	if got := GitCommit(dir); got != clean+"-dirty" {
		t.Errorf("results changed, nothing excluded: %q, want dirty", got)
	}
}

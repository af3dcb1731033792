package lab

import (
	"os/exec"
	"strings"
)

// GitCommit is the commit checked out in the git tree at root, "-dirty"
// appended when tracked files outside the excluded paths (relative to
// root) have uncommitted changes; empty when there is no tree or git.
func GitCommit(root string, exclude ...string) string {
	head, err := exec.Command("git", "-C", root, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return ""
	}
	commit := strings.TrimSpace(string(head))
	args := []string{"-C", root, "status", "--porcelain", "--untracked-files=no", "--", "."}
	for _, e := range exclude {
		args = append(args, ":!"+e)
	}
	if out, err := exec.Command("git", args...).Output(); err == nil && len(out) > 0 {
		commit += "-dirty"
	}
	return commit
}

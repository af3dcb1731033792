package lab

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/weirnet/weir/internal/image"
	"github.com/weirnet/weir/internal/version"
)

// A release is an earlier commit of this repository as an operator would
// have installed it: its chart and its agent image (its own weir-agent and
// weir-cni, packed by today's image builder, which makes the same layout
// from any binaries). A lab comes up with one (Config.Release) to be
// upgraded to the tree's (UpgradeWeir), as `helm upgrade` would.
type release struct {
	Commit string // full hash
	Chart  string // the chart's directory
	Image  string // the image's OCI archive
	Ref    string // the image's name and tag
}

// buildRelease builds commit's chart and image from `git archive` of it,
// once: they are cached in the lab's cache by commit.
func buildRelease(ctx context.Context, commit string, out io.Writer) (r release, retErr error) {
	full, when, err := resolveCommit(ctx, commit)
	if err != nil {
		return r, err
	}
	dir := filepath.Join(CacheDir(), "releases", full)
	r = release{Commit: full, Chart: filepath.Join(dir, "chart"), Image: filepath.Join(dir, "weir-agent.oci.tar"),
		Ref: strings.SplitN(AgentImage, ":", 2)[0] + ":" + full[:12]}
	if _, err := os.Stat(r.Image); err == nil {
		return r, nil
	}
	fmt.Fprintf(out, "==> building release %s (its chart and agent image; cached after)\n", full[:12])
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return r, err
	}
	work, err := os.MkdirTemp(filepath.Dir(dir), ".build-"+full[:12]+"-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(work)
	src := filepath.Join(work, "src")
	if err := extractCommit(ctx, full, src); err != nil {
		return r, err
	}
	bin := filepath.Join(work, "bin")
	if err := buildReleaseBinaries(ctx, src, bin, full, when); err != nil {
		return r, err
	}
	staged := filepath.Join(work, "out")
	if err := os.CopyFS(filepath.Join(staged, "chart"), os.DirFS(filepath.Join(src, "deploy", "helm", "weir"))); err != nil {
		return r, fmt.Errorf("release %s: its chart: %w", full[:12], err)
	}
	if err := writeReleaseImage(r.Ref, when, full, bin, filepath.Join(staged, "weir-agent.oci.tar")); err != nil {
		return r, fmt.Errorf("release %s: %w", full[:12], err)
	}
	// Whole or not at all: a build cut short leaves only its work
	// directory, removed above.
	if err := os.Rename(staged, dir); err != nil {
		return r, err
	}
	return r, nil
}

// resolveCommit names commit in full, with its commit time, from the git
// checkout the lab runs in.
func resolveCommit(ctx context.Context, commit string) (string, time.Time, error) {
	out, err := exec.CommandContext(ctx, "git", "log", "-1", "--format=%H %cI", commit+"^{commit}", "--").Output()
	if err != nil {
		return "", time.Time{}, fmt.Errorf("release %q: not a commit of the git checkout here (%w): a release is built from this repository's history", commit, err)
	}
	hash, when, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	t, err := time.Parse(time.RFC3339, when)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("release %s: commit time %q: %w", commit, when, err)
	}
	return hash, t.UTC(), nil
}

// extractCommit writes commit's tree to dir.
func extractCommit(ctx context.Context, commit, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// From the top: in a subdirectory, git archive takes only its subtree.
	top, err := exec.CommandContext(ctx, "git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return fmt.Errorf("find the git checkout's top: %w", err)
	}
	archive := exec.CommandContext(ctx, "git", "-C", strings.TrimSpace(string(top)), "archive", "--format=tar", commit)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return err
	}
	untar.Stdin = pipe
	var archErr, untarErr strings.Builder
	archive.Stderr, untar.Stderr = &archErr, &untarErr
	if err := untar.Start(); err != nil {
		return err
	}
	if err := archive.Run(); err != nil {
		untar.Wait()
		return fmt.Errorf("git archive %s: %w: %s", commit, err, archErr.String())
	}
	if err := untar.Wait(); err != nil {
		return fmt.Errorf("extract %s: %w: %s", commit, err, untarErr.String())
	}
	return nil
}

// buildReleaseBinaries builds the release's static weir-agent and weir-cni
// into bin, stamped with its commit as hack/deps.sh stamps the tree's.
func buildReleaseBinaries(ctx context.Context, src, bin, commit string, when time.Time) error {
	pkg := "github.com/weirnet/weir/internal/version"
	ldflags := fmt.Sprintf("-X %s.commit=%s -X %s.commitTime=%s", pkg, commit, pkg, when.Format(time.RFC3339))
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", bin+"/", "./cmd/weir-agent", "./cmd/weir-cni")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("release %s: go build: %w: %s", commit[:12], err, out)
	}
	return nil
}

// writeReleaseImage packs bin's binaries as the agent image ref, for this
// machine's platform, into the OCI archive out.
func writeReleaseImage(ref string, when time.Time, commit, bin, out string) error {
	repo, tag, _ := strings.Cut(ref, ":")
	platform := runtime.GOOS + "/" + runtime.GOARCH
	info := version.Info{Version: version.Version, Commit: commit, CommitTime: when, Platform: platform}
	return writeImageArchive(image.AgentSpec(repo, tag, when, info, map[string]string{platform: bin}), ref, when, out)
}

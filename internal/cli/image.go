package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/weirnet/weir/internal/image"
	"github.com/weirnet/weir/internal/version"
)

// NewImageCommand is `weir image`: the agent's container image.
func NewImageCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Build Weir's agent image without a container engine"}
	cmd.AddCommand(newImageBuildCommand())
	return cmd
}

type imageBuild struct {
	out, repository, tag string
	platforms            []string
}

func newImageBuildCommand() *cobra.Command {
	b := imageBuild{}
	cmd := &cobra.Command{
		Use:   "build",
		Short: "Build the agent image for several platforms as an OCI layout and an OCI archive, reproducibly",
		Long: "Cross-compiles weir-agent and weir-cni for each platform from this source tree (run it from the " +
			"repository's root), and writes <out>/oci (an OCI image layout) and <out>/weir-agent-<tag>.oci.tar (the " +
			"same as an OCI archive). File times and the creation time are the commit's, so two builds of one commit " +
			"have one digest. Load or push it with: ctr images import <archive>, skopeo copy oci-archive:<archive> " +
			"docker://<registry>/weir-agent:<tag>, or crane push <out>/oci <registry>/weir-agent:<tag>.",
		Example: "  weir image build --out bin/image\n  weir image build --platforms linux/arm64 --repository registry.example/weir-agent",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return b.run(cmd.Context(), cmd.OutOrStdout())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&b.out, "out", "bin/image", "directory to write the layout and the archive into (must not exist)")
	fl.StringVar(&b.repository, "repository", "ghcr.io/weirnet/weir-agent", "the image's repository (the Helm chart's image.repository)")
	fl.StringVar(&b.tag, "tag", version.Version, "the image's tag (the Helm chart's appVersion by default)")
	fl.StringSliceVar(&b.platforms, "platforms", []string{"linux/amd64", "linux/arm64"}, "platforms to build for")
	return cmd
}

func (b imageBuild) run(ctx context.Context, out io.Writer) error {
	if _, err := os.Stat(b.out); err == nil {
		return fmt.Errorf("--out %s exists: remove it first, so nothing of an older build is mixed in", b.out)
	}
	src, err := sourceOf(ctx)
	if err != nil {
		return err
	}
	scratch, err := os.MkdirTemp("", "weir-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	dirs := map[string]string{}
	for _, p := range b.platforms {
		goos, goarch, ok := strings.Cut(p, "/")
		if !ok {
			return fmt.Errorf("--platforms %q: want os/arch such as linux/arm64", p)
		}
		dir := filepath.Join(scratch, goos+"-"+goarch)
		fmt.Fprintf(out, "building weir-agent and weir-cni for %s\n", p)
		if err := crossBuild(ctx, goos, goarch, src.ldflags(), dir); err != nil {
			return err
		}
		dirs[p] = dir
	}
	info := version.Info{Version: b.tag, Commit: src.commit}
	spec := image.AgentSpec(b.repository, b.tag, src.time, info, dirs)
	idx, err := image.Build(spec)
	if err != nil {
		return err
	}
	layout := filepath.Join(b.out, "oci")
	if err := image.WriteLayout(layout, spec.Ref(), idx); err != nil {
		return err
	}
	archive := filepath.Join(b.out, "weir-agent-"+b.tag+".oci.tar")
	if err := image.WriteArchive(layout, archive, src.time); err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s %s (%s)\n  layout:  %s\n  archive: %s\n", spec.Ref(), digest, strings.Join(spec.Platforms(), ", "), layout, archive)
	return nil
}

// source is the commit an image is built from.
type source struct {
	commit   string
	time     time.Time
	timeText string // as git prints it
	modified bool
}

// ldflags stamp the commit into the binaries exactly as hack/deps.sh's
// weir_build does, so its binaries and the image's are the same.
func (s source) ldflags() string {
	const pkg = "github.com/weirnet/weir/internal/version"
	f := fmt.Sprintf("-X %s.commit=%s -X %s.commitTime=%s", pkg, s.commit, pkg, s.timeText)
	if s.modified {
		f += " -X " + pkg + ".modified=true"
	}
	return f
}

// sourceOf reads the commit of the working tree, which must be Weir's.
func sourceOf(ctx context.Context) (source, error) {
	mod, err := exec.CommandContext(ctx, "go", "list", "-m").Output()
	if err != nil || strings.TrimSpace(string(mod)) != "github.com/weirnet/weir" {
		return source{}, fmt.Errorf("weir image build runs in Weir's source tree (go list -m says %q): cd to the repository first", strings.TrimSpace(string(mod)))
	}
	git := func(args ...string) (string, error) {
		b, err := exec.CommandContext(ctx, "git", args...).Output()
		return strings.TrimSpace(string(b)), err
	}
	var s source
	if s.commit, err = git("rev-parse", "HEAD"); err != nil {
		return s, fmt.Errorf("read the commit (git rev-parse HEAD): %w: the image is dated and labelled by it", err)
	}
	t, err := git("log", "-1", "--format=%cI")
	if err != nil {
		return s, fmt.Errorf("read the commit's time: %w", err)
	}
	s.timeText = t
	if s.time, err = time.Parse(time.RFC3339, t); err != nil {
		return s, fmt.Errorf("the commit's time %q: %w", t, err)
	}
	status, err := git("status", "--porcelain", "--untracked-files=no")
	s.modified = err != nil || status != ""
	return s, nil
}

// crossBuild builds weir-agent and weir-cni for goos/goarch into dir.
func crossBuild(ctx context.Context, goos, goarch, ldflags, dir string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", ldflags, "-o", dir+"/", "./cmd/weir-agent", "./cmd/weir-cni")
	cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH="+goarch, "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build for %s/%s: %w: %s", goos, goarch, err, stderr.String())
	}
	return nil
}

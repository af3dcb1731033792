package lab

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/weirnet/weir/internal/image"
	"github.com/weirnet/weir/internal/version"
)

// agentImage builds the agent image as `weir image build` does (one
// builder, internal/image), for this machine's platform from the lab's
// binaries, and returns its OCI archive, cached by the binaries' content.
func agentImage(binDir string) (string, error) {
	repo, tag, _ := strings.Cut(AgentImage, ":")
	platform := runtime.GOOS + "/" + runtime.GOARCH
	info := version.Get()
	created := info.CommitTime
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	spec := image.AgentSpec(repo, tag, created, info, map[string]string{platform: binDir})
	for _, src := range spec.Files[platform] {
		if err := checkStatic(src); err != nil {
			return "", fmt.Errorf("image %s: %w", AgentImage, err)
		}
	}
	key, err := filesKey(spec.Files[platform])
	if err != nil {
		return "", fmt.Errorf("image %s: %w", AgentImage, err)
	}
	out := filepath.Join(CacheDir(), "images", "weir-agent-"+key+".oci.tar")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	return out, writeImageArchive(spec, AgentImage, created, out)
}

// writeImageArchive builds spec as the image ref and writes it as the OCI
// archive out, its layout staged beside it.
func writeImageArchive(spec image.Spec, ref string, created time.Time, out string) error {
	idx, err := image.Build(spec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	dir, err := os.MkdirTemp(filepath.Dir(out), ".weir-agent-layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	layout := filepath.Join(dir, "oci")
	if err := image.WriteLayout(layout, ref, idx); err != nil {
		return err
	}
	return image.WriteArchive(layout, out, created)
}

// filesKey hashes the files' names and contents.
func filesKey(files map[string]string) (string, error) {
	h := sha256.New()
	if err := hashFiles(h, files); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

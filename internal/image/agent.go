package image

import (
	"path/filepath"
	"time"

	"github.com/weirnet/weir/internal/version"
)

// AgentEntrypoint is the agent image's entrypoint; its init container
// runs `weir-agent install-cni` from the same binary, so the image needs
// no shell.
const AgentEntrypoint = "/usr/bin/weir-agent"

// AgentSpec is the agent image: weir-agent and weir-cni of each platform,
// from binDirs (platform -> a directory holding both, built for it), and
// info's version and commit as its labels.
func AgentSpec(repository, tag string, created time.Time, info version.Info, binDirs map[string]string) Spec {
	files := map[string]map[string]string{}
	for platform, dir := range binDirs {
		files[platform] = map[string]string{
			AgentEntrypoint:     filepath.Join(dir, "weir-agent"),
			"/usr/bin/weir-cni": filepath.Join(dir, "weir-cni"),
		}
	}
	labels := map[string]string{
		"org.opencontainers.image.title":   "weir-agent",
		"org.opencontainers.image.version": info.Version,
		"org.opencontainers.image.source":  "https://github.com/weirnet/weir",
	}
	if info.Commit != "" {
		labels["org.opencontainers.image.revision"] = info.Commit
	}
	return Spec{Repository: repository, Tag: tag, Created: created.UTC(), Files: files,
		Entrypoint: []string{AgentEntrypoint}, Labels: labels}
}

package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"time"
)

// Version is the release this source is: the image tag and the Helm
// chart's appVersion say the same. A release build may set it with
// -ldflags "-X github.com/weirnet/weir/internal/version.Version=...".
var Version = "0.1.0-dev"

// The source of the build, set with -ldflags -X by hack/deps.sh's
// weir_build, for toolchains that do not stamp it themselves
// (GOFLAGS=-buildvcs=false, a source tree outside git): when set they win
// over what debug.ReadBuildInfo says.
var (
	commit     string
	commitTime string // RFC 3339
	modified   string // "true" when the tree had changes
)

// Info identifies one build of a Weir binary.
type Info struct {
	Version string `json:"version"`
	// Commit is the git commit the binary was built from, Modified
	// whether the tree had changes beside it; empty when built outside a
	// git checkout (or with -buildvcs=false).
	Commit   string `json:"commit,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	// CommitTime is when Commit was made: builds of one commit carry the
	// same time, so the image is reproducible.
	CommitTime time.Time `json:"commitTime,omitzero"`
	GoVersion  string    `json:"goVersion"`
	Platform   string    `json:"platform"` // GOOS/GOARCH
}

// Get returns this binary's Info, from Version and what the Go toolchain
// recorded of the source (debug.ReadBuildInfo).
func Get() Info {
	info := Info{Version: Version, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		info.fromSettings(bi.Settings)
	}
	if commit != "" {
		info.Commit, info.Modified, info.CommitTime = commit, modified == "true", time.Time{}
		if t, err := time.Parse(time.RFC3339, commitTime); err == nil {
			info.CommitTime = t.UTC()
		}
	}
	return info
}

// fromSettings takes the source the Go toolchain stamped into the binary.
func (info *Info) fromSettings(settings []debug.BuildSetting) {
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			info.Commit = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		case "vcs.time":
			if t, err := time.Parse(time.RFC3339, s.Value); err == nil {
				info.CommitTime = t.UTC()
			}
		}
	}
}

// String is Info on one line: "0.1.0-dev (commit 0123abcd4567, modified,
// 2026-11-27T12:00:00Z, go1.25.0 linux/amd64)".
func (i Info) String() string {
	src := "commit unknown"
	if i.Commit != "" {
		src = "commit " + short(i.Commit)
		if i.Modified {
			src += ", modified"
		}
	}
	if !i.CommitTime.IsZero() {
		src += ", " + i.CommitTime.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("%s (%s, %s %s)", i.Version, src, i.GoVersion, i.Platform)
}

func short(commit string) string {
	if len(commit) > 12 {
		return commit[:12]
	}
	return commit
}

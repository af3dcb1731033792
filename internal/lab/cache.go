package lab

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// CacheDir is where the lab keeps binaries it builds from Go modules,
// keyed by module and version, so only the first run pays for the build.
func CacheDir() string {
	if d := os.Getenv("WEIR_CACHE"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "/root"
	}
	return filepath.Join(home, ".cache", "weir")
}

// ReferencePluginsVersion is the containernetworking/plugins release the
// lab's baselines use.
const ReferencePluginsVersion = "v1.9.1"

// ReferencePlugins returns a directory holding the reference bridge and
// host-local plugins, building them from their Go module the first time.
func ReferencePlugins(ctx context.Context) (string, error) {
	return referencePluginsBuild().Run(ctx, nil)
}

func referencePluginsBuild() GoBuild {
	mod := "github.com/containernetworking/plugins"
	return GoBuild{
		Name: "cni-plugins", Module: mod, Version: ReferencePluginsVersion,
		Pkgs: []string{mod + "/plugins/main/bridge", mod + "/plugins/ipam/host-local", mod + "/plugins/main/loopback", mod + "/plugins/meta/portmap"},
	}
}

// GoBuild builds main packages of one module version into the cache, in a
// scratch module of its own so Weir's go.mod is not involved.
type GoBuild struct {
	Name    string   // cache directory name, with Version appended
	Module  string   // module to require
	Version string   // its version
	Pkgs    []string // main packages to build; "." means Main below
	Main    string   // source of a local main package, if any
	// Test makes Main the source of a test file instead, built with
	// `go test -c` into a test binary called Name (an upstream e2e suite).
	Test    bool
	Replace map[string]string // module => module@version replacements
	Tags    string            // build tags
	LDFlags string            // linker flags
	Env     []string          // extra environment for go build, such as CGO_ENABLED=0
}

// binaries are the names the build produces.
func (b GoBuild) binaries() []string {
	var out []string
	for _, p := range b.Pkgs {
		if p == "." {
			out = append(out, b.Name)
		} else {
			out = append(out, filepath.Base(p))
		}
	}
	return out
}

// dir is where the binaries are cached.
func (b GoBuild) dir() string { return filepath.Join(CacheDir(), b.Name+"@"+b.Version) }

// Run builds what is not cached yet and returns the cache directory.
// Progress lines go to progress (nil: silent); a cold Kubernetes build
// takes minutes and must not look hung.
func (b GoBuild) Run(ctx context.Context, progress io.Writer) (string, error) {
	dir := b.dir()
	complete := true
	for _, bin := range b.binaries() {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			complete = false
		}
	}
	if complete {
		return dir, nil
	}
	if progress != nil {
		fmt.Fprintf(progress, "building %s %s into %s (first time only)\n", b.Name, b.Version, dir)
	}
	scratch, err := os.MkdirTemp("", "weir-build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(scratch)
	if b.Main != "" {
		file := "main.go"
		if b.Test {
			file = "suite_test.go"
		}
		if err := os.WriteFile(filepath.Join(scratch, file), []byte(b.Main), 0o644); err != nil {
			return "", err
		}
	}
	steps := [][]string{{"go", "mod", "init", "weirbuild"}}
	for from, to := range b.Replace {
		steps = append(steps, []string{"go", "mod", "edit", "-replace", from + "=" + to})
	}
	get := []string{"go", "get", b.Module + "@" + b.Version}
	for _, p := range b.Pkgs {
		if p != "." {
			get = append(get, p+"@"+b.Version)
		}
	}
	steps = append(steps, get)
	if b.Main != "" {
		// Only a local main imports anything; tidy would otherwise drop
		// the requirements go get just added.
		steps = append(steps, []string{"go", "mod", "tidy"})
	}
	build := []string{"go", "build", "-trimpath"}
	if b.Test {
		build = []string{"go", "test", "-c", "-trimpath"}
	}
	if b.Tags != "" {
		build = append(build, "-tags", b.Tags)
	}
	if b.LDFlags != "" {
		build = append(build, "-ldflags", b.LDFlags)
	}
	if len(b.Pkgs) == 1 && b.Pkgs[0] == "." {
		build = append(build, "-o", filepath.Join(dir, b.Name), ".")
	} else {
		build = append(append(build, "-o", dir+"/"), b.Pkgs...)
	}
	steps = append(steps, build)
	for _, s := range steps {
		start := time.Now()
		cmd := exec.CommandContext(ctx, s[0], s[1:]...)
		cmd.Dir = scratch
		cmd.Env = append(os.Environ(), b.Env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("build %s@%s (%s): %w\n%s", b.Module, b.Version, strings.Join(s, " "), err, out)
		}
		if progress != nil && time.Since(start) > 5*time.Second {
			fmt.Fprintf(progress, "  %s: %s done in %s\n", b.Name, s[1], time.Since(start).Round(time.Second))
		}
	}
	return dir, nil
}

package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	mod := "github.com/containernetworking/plugins"
	return buildCached(ctx, mod, ReferencePluginsVersion,
		mod+"/plugins/main/bridge", mod+"/plugins/ipam/host-local")
}

// buildCached builds pkgs of module@version into the cache, in a scratch
// module of its own so Weir's go.mod is not involved.
func buildCached(ctx context.Context, module, version string, pkgs ...string) (string, error) {
	dir := filepath.Join(CacheDir(), strings.ReplaceAll(module, "/", "_")+"@"+version)
	complete := true
	for _, p := range pkgs {
		if _, err := os.Stat(filepath.Join(dir, filepath.Base(p))); err != nil {
			complete = false
		}
	}
	if complete {
		return dir, nil
	}
	scratch, err := os.MkdirTemp("", "weir-build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(scratch)
	get := []string{"go", "get"}
	for _, p := range pkgs {
		get = append(get, p+"@"+version)
	}
	steps := [][]string{
		{"go", "mod", "init", "weirbuild"},
		get,
		append([]string{"go", "build", "-o", dir + "/"}, pkgs...),
	}
	for _, s := range steps {
		cmd := exec.CommandContext(ctx, s[0], s[1:]...)
		cmd.Dir = scratch
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("build %s@%s (%s): %w\n%s", module, version, strings.Join(s, " "), err, out)
		}
	}
	return dir, nil
}

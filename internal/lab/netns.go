package lab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
)

// netnsDir is where iproute2 and runtimes keep named namespaces.
const netnsDir = "/var/run/netns"

// nsPath is the bind-mount path of a named namespace.
func nsPath(name string) string { return filepath.Join(netnsDir, name) }

// createNetNS makes a named network namespace without moving the caller.
func createNetNS(name string) (retErr error) {
	if _, err := os.Stat(nsPath(name)); err == nil {
		return fmt.Errorf("network namespace %s already exists (run `weir lab down` first)", name)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return fmt.Errorf("get current netns: %w", err)
	}
	defer orig.Close()
	h, err := netns.NewNamed(name)
	if err != nil {
		return fmt.Errorf("create netns %s: %w", name, err)
	}
	h.Close()
	if err := netns.Set(orig); err != nil {
		return fmt.Errorf("return to original netns: %w", err)
	}
	return nil
}

// deleteNetNS removes a named namespace; a missing one is not an error.
func deleteNetNS(name string) error {
	if err := netns.DeleteNamed(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete netns %s: %w", name, err)
	}
	return nil
}

// listNetNS returns the named namespaces whose names start with prefix.
func listNetNS(prefix string) ([]string, error) {
	ents, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

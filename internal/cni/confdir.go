package cni

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// SetAsideSuffix is added to another CNI's configuration file that the
// agent sets aside: the runtime reads only .conf, .conflist and .json.
const SetAsideSuffix = ".weir_bak"

// configExts are the names a runtime (libcni's ConfFiles) reads as
// network configurations.
var configExts = []string{".conf", ".conflist", ".json"}

// SetAsideOthers renames every network configuration in dir but Weir's to
// <name>.weir_bak, so the runtime attaches new pods with Weir whatever
// the names sort to: a runtime takes the first configuration by name, and
// another CNI's (05-cilium.conflist, 00-*) can sort before Weir's. Pods it
// already attached keep their network until they are recreated. It
// returns the names it set aside.
func SetAsideOthers(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read CNI config dir: %w", err)
	}
	var moved []string
	for _, e := range ents {
		name := e.Name()
		if name == ConfListName || e.IsDir() || !slices.Contains(configExts, filepath.Ext(name)) {
			continue
		}
		if err := os.Rename(filepath.Join(dir, name), filepath.Join(dir, name+SetAsideSuffix)); err != nil {
			return moved, fmt.Errorf("set aside the CNI config %s: %w", name, err)
		}
		moved = append(moved, name)
	}
	return moved, nil
}

// RestoreOthers gives back the names SetAsideOthers took, unless a file
// of that name has appeared since (the next CNI wrote its own): then the
// set-aside copy goes. It returns what it restored and removed.
func RestoreOthers(dir string) (restored, removed []string, _ error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read CNI config dir: %w", err)
	}
	var errs []error
	for _, e := range ents {
		orig, ok := strings.CutSuffix(e.Name(), SetAsideSuffix)
		if !ok || e.IsDir() {
			continue
		}
		from, to := filepath.Join(dir, e.Name()), filepath.Join(dir, orig)
		if _, err := os.Lstat(to); err == nil {
			if err := os.Remove(from); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, e.Name())
			continue
		}
		if err := os.Rename(from, to); err != nil {
			errs = append(errs, err)
			continue
		}
		restored = append(restored, orig)
	}
	return restored, removed, errors.Join(errs...)
}

package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
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
		if err := setAside(dir, name); err != nil {
			return moved, fmt.Errorf("set aside the CNI config %s: %w", name, err)
		}
		moved = append(moved, name)
	}
	return moved, nil
}

// setAside renames name to name.weir_bak without replacing a copy set
// aside before (its CNI wrote the file again): an identical file is
// dropped, a different one kept under its modification time
// (name.<unix-nanoseconds>.weir_bak, given back under that name).
func setAside(dir, name string) error {
	from := filepath.Join(dir, name)
	err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, from+SetAsideSuffix, unix.RENAME_NOREPLACE)
	if !errors.Is(err, unix.EEXIST) {
		return err
	}
	cur, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	if old, err := os.ReadFile(from + SetAsideSuffix); err == nil && bytes.Equal(old, cur) {
		return os.Remove(from)
	}
	st, err := os.Stat(from)
	if err != nil {
		return err
	}
	return unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, fmt.Sprintf("%s.%d%s", from, st.ModTime().UnixNano(), SetAsideSuffix), unix.RENAME_NOREPLACE)
}

// Restored is what RestoreOthers did with the set-aside configurations.
type Restored struct {
	Restored []string // names given back
	Removed  []string // set-aside copies of a name the next CNI wrote since
	// Kept are set-aside names left as they are: a plugin they call is
	// not in the bin directory (their CNI went), and giving them back
	// would make the node Ready for pods no plugin can attach.
	Kept []string
}

// RestoreOthers gives back the names SetAsideOthers took, once Weir's own
// configuration is gone: each whose plugins are all in binDir, unless a
// file of that name has appeared since (the next CNI wrote its own: then
// the set-aside copy goes).
func RestoreOthers(dir, binDir string) (Restored, error) {
	var out Restored
	if _, err := os.Lstat(filepath.Join(dir, ConfListName)); err == nil {
		return out, fmt.Errorf("%s is still there: other CNIs' configurations stay set aside while Weir's is", filepath.Join(dir, ConfListName))
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("read CNI config dir: %w", err)
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
			out.Removed = append(out.Removed, e.Name())
			continue
		}
		if !pluginsPresent(from, binDir) {
			out.Kept = append(out.Kept, e.Name())
			continue
		}
		if err := os.Rename(from, to); err != nil {
			errs = append(errs, err)
			continue
		}
		out.Restored = append(out.Restored, orig)
	}
	return out, errors.Join(errs...)
}

// pluginsPresent says whether every plugin the network configuration in
// file calls (a list's plugins, or a single configuration's type) is in
// binDir. A file that is no configuration calls nothing it could miss.
func pluginsPresent(file, binDir string) bool {
	b, err := os.ReadFile(file)
	if err != nil {
		return false
	}
	var conf struct {
		Type    string `json:"type"`
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if json.Unmarshal(b, &conf) != nil {
		return true
	}
	types := []string{conf.Type}
	for _, p := range conf.Plugins {
		types = append(types, p.Type)
	}
	for _, t := range types {
		if t == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(binDir, filepath.Base(t))); err != nil {
			return false
		}
	}
	return true
}

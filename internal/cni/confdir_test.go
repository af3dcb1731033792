package cni

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestSetAsideOthersAndRestore: every other network configuration is set
// aside, whatever its name sorts to, and nothing else in the directory is
// touched; a configuration its CNI wrote again is set aside without losing
// the first copy. Restoring waits until Weir's own is gone, then gives each
// back whose plugins are installed, drops the copy of a name the next CNI
// wrote meanwhile, and keeps one whose plugin is gone.
func TestSetAsideOthersAndRestore(t *testing.T) {
	dir, bin := t.TempDir(), t.TempDir()
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	list := func(types ...string) string {
		var ps []string
		for _, ty := range types {
			ps = append(ps, `{"type":"`+ty+`"}`)
		}
		return `{"cniVersion":"1.0.0","name":"n","plugins":[` + strings.Join(ps, ",") + `]}`
	}
	for _, p := range []string{"cilium-cni", "flannel", "portmap", "loopback"} {
		if err := os.WriteFile(filepath.Join(bin, p), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(ConfListName, "weir")
	write("05-cilium.conflist", list("cilium-cni"))
	write("10-flannel.conflist", list("flannel", "portmap"))
	write("99-loopback.conf", `{"cniVersion":"1.0.0","name":"lo","type":"loopback"}`)
	write("00-gone.json", list("removed-plugin"))
	write("README", "docs")
	moved, err := SetAsideOthers(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"00-gone.json", "05-cilium.conflist", "10-flannel.conflist", "99-loopback.conf"}; !slices.Equal(moved, want) {
		t.Errorf("set aside %v, want %v", moved, want)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"00-gone.json.weir_bak", "05-cilium.conflist.weir_bak", ConfListName, "10-flannel.conflist.weir_bak",
		"99-loopback.conf.weir_bak", "README"}) {
		t.Errorf("directory %v", got)
	}
	// Cilium's agent, still running, writes its config again: the first
	// copy stays; then again identically.
	write("05-cilium.conflist", list("cilium-cni", "portmap"))
	write("99-loopback.conf", `{"cniVersion":"1.0.0","name":"lo","type":"loopback"}`)
	if again, err := SetAsideOthers(dir); err != nil || !slices.Equal(again, []string{"05-cilium.conflist", "99-loopback.conf"}) {
		t.Fatalf("second pass set aside %v (%v)", again, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "05-cilium.conflist.weir_bak")); string(b) != list("cilium-cni") {
		t.Errorf("the first set-aside copy was replaced: %q", b)
	}
	if n := len(names(t, dir)); n != 7 {
		t.Errorf("directory %v: want the rewritten cilium config kept beside the first, the identical loopback one dropped", names(t, dir))
	}

	if _, err := RestoreOthers(dir, bin); err == nil {
		t.Fatal("RestoreOthers gave configurations back while Weir's is there")
	}
	os.Remove(filepath.Join(dir, ConfListName))
	write("10-flannel.conflist", "new") // the next CNI's own
	got, err := RestoreOthers(dir, bin)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Restored) != 3 || !slices.Contains(got.Restored, "05-cilium.conflist") || !slices.Contains(got.Restored, "99-loopback.conf") ||
		!slices.Equal(got.Removed, []string{"10-flannel.conflist.weir_bak"}) || !slices.Equal(got.Kept, []string{"00-gone.json.weir_bak"}) {
		t.Errorf("restored %v, removed %v, kept %v", got.Restored, got.Removed, got.Kept)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "10-flannel.conflist")); string(b) != "new" {
		t.Errorf("the next CNI's config was overwritten: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "05-cilium.conflist")); string(b) != list("cilium-cni") {
		t.Errorf("restored config holds %q", b)
	}
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

package cni

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestSetAsideOthersAndRestore: every other network configuration is set
// aside, whatever its name sorts to, and nothing else in the directory is
// touched; restoring gives each back, except where the next CNI wrote one
// of the same name meanwhile.
func TestSetAsideOthersAndRestore(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{ConfListName, "05-cilium.conflist", "10-flannel.conflist", "99-loopback.conf", "00-x.json", "README", "calico-kubeconfig"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	moved, err := SetAsideOthers(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"00-x.json", "05-cilium.conflist", "10-flannel.conflist", "99-loopback.conf"}; !slices.Equal(moved, want) {
		t.Errorf("set aside %v, want %v", moved, want)
	}
	if got := names(t, dir); !slices.Equal(got, []string{"00-x.json.weir_bak", "05-cilium.conflist.weir_bak", ConfListName, "10-flannel.conflist.weir_bak",
		"99-loopback.conf.weir_bak", "README", "calico-kubeconfig"}) {
		t.Errorf("directory %v", got)
	}
	if again, err := SetAsideOthers(dir); err != nil || len(again) != 0 {
		t.Errorf("a second pass set aside %v (%v), want nothing", again, err)
	}

	// The next CNI wrote its own 10-flannel.conflist before Weir's went.
	if err := os.WriteFile(filepath.Join(dir, "10-flannel.conflist"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	restored, removed, err := RestoreOthers(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(restored, []string{"00-x.json", "05-cilium.conflist", "99-loopback.conf"}) || !slices.Equal(removed, []string{"10-flannel.conflist.weir_bak"}) {
		t.Errorf("restored %v, removed %v", restored, removed)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "10-flannel.conflist")); string(b) != "new" {
		t.Errorf("the next CNI's config was overwritten: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "05-cilium.conflist")); string(b) != "05-cilium.conflist" {
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

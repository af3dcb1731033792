package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestInstallPlugin: the plugin lands executable under its own name,
// replaces an older one, leaves no temporary file, and a missing source
// fails naming it.
func TestInstallPlugin(t *testing.T) {
	src := filepath.Join(t.TempDir(), "weir-cni")
	if err := os.WriteFile(src, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "opt", "cni", "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "weir-cni"), []byte("old"), 0o755); err != nil {
		t.Fatal(err)
	}
	dst, err := installPlugin(src, dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(dst)
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("installed %s: %v %v, want mode 0755", dst, st, err)
	}
	if b, _ := os.ReadFile(dst); string(b) != "new" {
		t.Errorf("installed plugin holds %q, want the new one", b)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("bin dir holds %d entries, want the plugin alone", len(entries))
	}
	if _, err := installPlugin(filepath.Join(t.TempDir(), "nothing"), dir); err == nil {
		t.Error("a missing plugin installed")
	}
}

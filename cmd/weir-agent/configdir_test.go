package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigDirSetsFlags: a ConfigMap mounted as a directory sets the
// flags its keys name, the command line wins, the kubelet's dot entries
// are skipped, and a key naming no flag or holding a bad value is an
// error that names it.
func TestConfigDirSetsFlags(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "..2026_11_27")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NODE_NAME", "n7")
	for name, value := range map[string]string{"mode": "vxlan\n", "tunnel-port": "8472\n", "mtu": "1400",
		"state-dir": "/run/lab/$(NODE_NAME)/state", "socket": "/run/$(NOT_SET)/agent.sock"} {
		if err := os.WriteFile(filepath.Join(data, name), []byte(value), 0o644); err != nil {
			t.Fatal(err)
		}
		// The kubelet's layout: each key a link into the data directory.
		if err := os.Symlink(filepath.Join(filepath.Base(data), name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(data), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	cmd := newCommand()
	if err := cmd.ParseFlags([]string{"--mode=native"}); err != nil {
		t.Fatal(err)
	}
	fl := cmd.Flags()
	if warnings, err := applyConfigDir(fl, dir); err != nil || len(warnings) != 0 {
		t.Fatal(warnings, err)
	}
	for name, want := range map[string]string{"mode": "native", "tunnel-port": "8472", "mtu": "1400", "cluster-cidr": "10.244.0.0/16",
		"state-dir": "/run/lab/n7/state", "socket": "/run/$(NOT_SET)/agent.sock"} {
		if got := fl.Lookup(name).Value.String(); got != want {
			t.Errorf("--%s = %q, want %q", name, got, want)
		}
	}

	// A key naming no flag (a newer agent's, or a typo) is a warning; a
	// value the flag refuses is an error.
	for name, c := range map[string]struct {
		value, want string
		fails       bool
	}{
		"tunnel-prot": {"8472", `"tunnel-prot" is no flag of this weir-agent`, false},
		"config-dir":  {"/etc", `"config-dir" is no flag`, false},
		"tunnel-port": {"70000", "tunnel-port", true},
	} {
		bad := t.TempDir()
		if err := os.WriteFile(filepath.Join(bad, name), []byte(c.value), 0o644); err != nil {
			t.Fatal(err)
		}
		warnings, err := applyConfigDir(newCommand().Flags(), bad)
		got := strings.Join(warnings, "; ")
		if err != nil {
			got = err.Error()
		}
		if (err != nil) != c.fails || !strings.Contains(got, c.want) {
			t.Errorf("%s=%s: warnings %v, error %v; want %s saying %q", name, c.value, warnings, err, map[bool]string{true: "an error", false: "a warning"}[c.fails], c.want)
		}
	}
}

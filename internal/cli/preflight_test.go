package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weirnet/weir/internal/datapath"
)

// TestPreflightNamesWhatIsMissing runs the real file-based checks against
// a simulated kernel without BTF and conntrack and with the JIT off: the
// table names each, with its problem and what breaks, the JIT as a
// warning, and the command fails naming the required ones.
func TestPreflightNamesWhatIsMissing(t *testing.T) {
	dir := t.TempDir()
	jit := filepath.Join(dir, "bpf_jit_enable")
	if err := os.WriteFile(jit, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	paths := datapath.PreflightPaths{BTF: filepath.Join(dir, "no-btf"), JIT: jit, Conntrack: filepath.Join(dir, "no-conntrack")}
	var checks []datapath.Check
	for _, c := range datapath.PreflightChecks(paths, datapath.ModeVXLAN) {
		switch c.Name {
		case "btf", "bpf jit", "conntrack":
			checks = append(checks, c)
		}
	}
	if len(checks) != 3 {
		t.Fatalf("found %d of the file-based checks, want 3", len(checks))
	}
	var out bytes.Buffer
	err := runPreflight(checks, false, &out)
	if !errors.Is(err, datapath.ErrPreflight) || !strings.Contains(err.Error(), "btf, conntrack") || strings.Contains(err.Error(), "jit") {
		t.Fatalf("error %v, want one naming btf and conntrack (not the JIT, a warning) wrapping ErrPreflight", err)
	}
	text := out.String()
	for _, want := range []string{
		"bpf jit", "warning", jit + " is 0: the JIT is off", "BPF interpreter",
		"btf", "MISSING", "no-btf: no such file", "CONFIG_DEBUG_INFO_BTF",
		"conntrack", "no-conntrack: no such file", "nf_conntrack",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the table lacks %q:\n%s", want, text)
		}
	}

	out.Reset()
	if err := runPreflight(checks, true, &out); err == nil {
		t.Fatal("-o json: no error for missing features")
	}
	var results []datapath.CheckResult
	if err := json.Unmarshal(out.Bytes(), &results); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out.String())
	}
	if len(results) != 3 || results[0].OK || results[0].Required || !results[1].Required || results[1].Problem == "" {
		t.Errorf("-o json results %+v", results)
	}
}

// TestPreflightPassesWhenAllIsThere: every check passing is no error, and
// a failed warning alone is none either.
func TestPreflightPassesWhenAllIsThere(t *testing.T) {
	ok := func() error { return nil }
	checks := []datapath.Check{
		{Name: "a", Required: true, Needed: "x", Probe: ok},
		{Name: "b", Required: false, Needed: "y", Probe: func() error { return errors.New("off") }},
	}
	var out bytes.Buffer
	if err := runPreflight(checks, false, &out); err != nil {
		t.Fatalf("a failed warning failed the preflight: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || strings.Fields(lines[1])[1] != "ok" || strings.Fields(lines[2])[1] != "warning" {
		t.Errorf("table, want a ok and b warning:\n%s", out.String())
	}
}

package cni

import (
	"encoding/json"
	"strings"
	"testing"

	weirversion "github.com/weirnet/weir/internal/version"
)

// TestAboutEndsWithTheBuild: what the plugin prints without CNI_COMMAND
// ends with its version.Info as JSON, which `weir version` reads.
func TestAboutEndsWithTheBuild(t *testing.T) {
	lines := strings.Split(About(), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "weir-cni: ") {
		t.Fatalf("About() = %q, want a line for people and a JSON line", About())
	}
	var info weirversion.Info
	if err := json.Unmarshal([]byte(lines[1]), &info); err != nil {
		t.Fatal(err)
	}
	if info != weirversion.Get() {
		t.Errorf("About's build %+v, want %+v", info, weirversion.Get())
	}
}

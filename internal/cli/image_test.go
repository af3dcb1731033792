package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestImageBuildTwice builds the agent image from this tree for amd64 and
// arm64, twice: the two builds report one digest (the build is
// reproducible), each writes a layout and an archive, and a second build
// into an existing directory is refused.
func TestImageBuildTwice(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(root)
	var reports []string
	for i := 0; i < 2; i++ {
		out := filepath.Join(t.TempDir(), "image")
		var b bytes.Buffer
		ib := imageBuild{out: out, repository: "example.test/weir-agent", tag: "t1", platforms: []string{"linux/amd64", "linux/arm64"}}
		if err := ib.run(context.Background(), &b); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"oci/index.json", "oci/oci-layout", "weir-agent-t1.oci.tar"} {
			if _, err := os.Stat(filepath.Join(out, f)); err != nil {
				t.Errorf("build %d wrote no %s", i, f)
			}
		}
		lines := strings.Split(b.String(), "\n")
		var report string
		for _, l := range lines {
			if strings.HasPrefix(l, "example.test/weir-agent:t1 sha256:") {
				report = l
			}
		}
		if report == "" || !strings.Contains(report, "linux/amd64, linux/arm64") {
			t.Fatalf("build %d printed %q", i, b.String())
		}
		reports = append(reports, report)
		if err := ib.run(context.Background(), &b); err == nil || !strings.Contains(err.Error(), "exists") {
			t.Errorf("a build into an existing directory: %v", err)
		}
	}
	if reports[0] != reports[1] {
		t.Errorf("two builds of one tree differ: %q and %q", reports[0], reports[1])
	}
}

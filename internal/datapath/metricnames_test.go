package datapath

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestMetricNamesFollowTheEnum: MetricNames is indexed by enum
// weir_metric in bpf/lib/metrics.h, each name the enumerator's suffix in
// lower case. An enumerator added, removed or moved without its name
// fails here instead of mislabelling every counter after it.
func TestMetricNamesFollowTheEnum(t *testing.T) {
	src, err := os.ReadFile("../../bpf/lib/metrics.h")
	if err != nil {
		t.Fatal(err)
	}
	body, ok := strings.CutPrefix(string(src[strings.Index(string(src), "enum weir_metric {"):]), "enum weir_metric {")
	if !ok {
		t.Fatal("enum weir_metric not found in bpf/lib/metrics.h")
	}
	body, _, _ = strings.Cut(body, "};")
	var enum []string
	for _, m := range regexp.MustCompile(`(?m)^\s*METRIC_([A-Z0-9_]+)\s*[,=]`).FindAllStringSubmatch(body, -1) {
		if m[1] != "MAX" {
			enum = append(enum, strings.ToLower(m[1]))
		}
	}
	if !slices.Equal(enum, MetricNames) {
		t.Fatalf("bpf/lib/metrics.h enumerates\n%v\nMetricNames holds\n%v", enum, MetricNames)
	}
}

// TestEveryMapIsDocumented: each map bpf/lib declares has its row in
// docs/datapath.md, so the page cannot fall behind the code unnoticed.
func TestEveryMapIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/datapath.md")
	if err != nil {
		t.Fatal(err)
	}
	headers, err := filepath.Glob("../../bpf/lib/*.h")
	if err != nil {
		t.Fatal(err)
	}
	decl := regexp.MustCompile(`\} (weir_[a-z0-9_]+) SEC\("\.maps"\)`)
	n := 0
	for _, h := range headers {
		src, err := os.ReadFile(h)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
			n++
			if !strings.Contains(string(doc), "`"+m[1]+"`") {
				t.Errorf("%s declares %s; docs/datapath.md does not describe it", h, m[1])
			}
		}
	}
	if n == 0 {
		t.Fatal("no map declarations found under bpf/lib")
	}
}

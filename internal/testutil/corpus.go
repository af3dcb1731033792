package testutil

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// SmugglingStreams are the streams of internal/l7's smuggling corpus
// (testdata/smuggling.txt: name, answer and quoted stream a line, tab
// separated), for the tests of every reader of requests.
func SmugglingStreams(t testing.TB) [][]byte {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(here), "..", "l7", "testdata", "smuggling.txt")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for i, line := range strings.Split(string(data), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.SplitN(line, "\t", 3)
		if len(f) != 3 {
			t.Fatalf("smuggling.txt:%d: want name, answer and stream separated by tabs", i+1)
		}
		s, err := strconv.Unquote(f[2])
		if err != nil {
			t.Fatalf("smuggling.txt:%d: %v", i+1, err)
		}
		out = append(out, []byte(s))
	}
	return out
}

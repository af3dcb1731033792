package testutil

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// SmugglingCase is one line of internal/l7's smuggling corpus
// (testdata/smuggling.txt: name, answer and quoted stream, tab separated).
type SmugglingCase struct {
	Name   string
	Answer int // 400, 403 or 200
	Stream []byte
}

// SmugglingCorpus reads the corpus, for the tests of every reader of
// requests.
func SmugglingCorpus(t testing.TB) []SmugglingCase {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(here), "..", "l7", "testdata", "smuggling.txt")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cases []SmugglingCase
	for i, line := range strings.Split(string(data), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.SplitN(line, "\t", 3)
		if len(f) != 3 {
			t.Fatalf("smuggling.txt:%d: want name, answer and stream separated by tabs", i+1)
		}
		answer, err := strconv.Atoi(f[1])
		if err != nil {
			t.Fatalf("smuggling.txt:%d: answer %q: %v", i+1, f[1], err)
		}
		stream, err := strconv.Unquote(f[2])
		if err != nil {
			t.Fatalf("smuggling.txt:%d: stream: %v", i+1, err)
		}
		cases = append(cases, SmugglingCase{Name: f[0], Answer: answer, Stream: []byte(stream)})
	}
	return cases
}

// SmugglingStreams are the corpus's streams alone.
func SmugglingStreams(t testing.TB) [][]byte {
	t.Helper()
	var out [][]byte
	for _, c := range SmugglingCorpus(t) {
		out = append(out, c.Stream)
	}
	return out
}

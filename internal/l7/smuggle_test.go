package l7

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/weirnet/weir/internal/testutil"
)

// smugglingCase is one line of testdata/smuggling.txt.
type smugglingCase = testutil.SmugglingCase

func readSmugglingCorpus(t *testing.T) []smugglingCase { return testutil.SmugglingCorpus(t) }

// corpusRules are the rules every corpus case runs under.
var corpusRules = []Rule{
	{Method: "GET", Path: &PathMatch{Type: PathPrefix, Value: "/public"}},
	{Method: "POST", Path: &PathMatch{Type: PathPrefix, Value: "/public"}},
}

// TestSmugglingCorpus sends every case through the parser and the rules
// as the datapath does: requests are passed while they are allowed, and
// the stream is cut where the first one is denied or refused. A bypass is
// a request a server reads from the bytes passed that the rules did not
// allow; the reference server is Go's net/http. The count must be 0.
func TestSmugglingCorpus(t *testing.T) {
	m, err := Compile(corpusRules)
	if err != nil {
		t.Fatal(err)
	}
	cases := readSmugglingCorpus(t)
	if len(cases) < 40 {
		t.Fatalf("corpus has %d cases; it lost some", len(cases))
	}
	bypasses := 0
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			passed, allowed, answer := judgeStream(t, m, c.Stream)
			if answer != c.Answer {
				t.Errorf("answer %d, want %d", answer, c.Answer)
			}
			n := countBypasses(t, passed, allowed)
			if n > 0 {
				t.Errorf("%d requests reached the server without being allowed", n)
			}
			bypasses += n
		})
	}
	t.Logf("%d cases, %d bypasses", len(cases), bypasses)
}

// judgeStream returns the bytes that may reach the server, the requests
// allowed among them, and the connection's answer: the status of the
// first request denied (403) or refused (400), or 200.
func judgeStream(t *testing.T, m *Matcher, stream []byte) ([]byte, []*Request, int) {
	t.Helper()
	p := NewParser(Limits{})
	p.RefuseRepeated(m.HeaderNames())
	reqs, perr := p.Feed(stream)
	var allowed []*Request
	for _, r := range reqs {
		i, err := m.Match(r)
		if err != nil || i < 0 {
			return stream[:r.Start], allowed, 403
		}
		allowed = append(allowed, r)
	}
	var re *RequestError
	if errors.As(perr, &re) {
		return stream[:re.Framed], allowed, re.Status
	}
	if perr != nil {
		t.Fatalf("Feed: %v is not a RequestError", perr)
	}
	return stream, allowed, 200
}

// countBypasses reads passed as net/http's server does and counts the
// requests it reads beyond, or other than, the allowed ones.
func countBypasses(t *testing.T, passed []byte, allowed []*Request) int {
	t.Helper()
	br := bufio.NewReader(bytes.NewReader(passed))
	n := 0
	for i := 0; ; i++ {
		skipBlankLines(br)
		req, err := http.ReadRequest(br)
		if err != nil {
			return n
		}
		if i >= len(allowed) || req.Method != allowed[i].Method || req.RequestURI != allowed[i].Target {
			t.Logf("net/http read %s %s, not an allowed request", req.Method, req.RequestURI)
			n++
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return n
		}
	}
}

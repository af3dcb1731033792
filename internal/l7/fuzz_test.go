package l7

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"testing"
)

// FuzzParser holds the parser to two properties on any input:
//
//   - cut anywhere into two reads, it reads what it reads whole (the
//     kernel hands segments over as they arrive);
//   - every request it accepts, Go's net/http server reads too, the same
//     method and target in the same order: where both accept a stream,
//     they frame it alike, so no request can hide inside another's body.
//
// CI runs it as a smoke test (hack/test.sh); `go test -fuzz FuzzParser
// ./internal/l7` runs it for as long as you let it.
func FuzzParser(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s), uint16(len(s)/2))
	}
	f.Fuzz(func(t *testing.T, in []byte, cut uint16) {
		whole, wholeErr := NewParser(Limits{}).Feed(in)
		checkSplitInvariance(t, in, int(cut), whole, wholeErr)
		checkAgainstNetHTTP(t, in, whole)
	})
}

var fuzzSeeds = []string{
	"GET / HTTP/1.1\r\nHost: h\r\n\r\n",
	"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\nHost: h\r\n\r\n",
	"POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5;x\r\nhello\r\n0\r\nT: 1\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\nHost: h\r\n\r\n",
	"GET http://h/x?y HTTP/1.1\r\nHost: h\r\n\r\n",
	"\r\nGET /%41/b;c HTTP/1.0\r\n\r\n",
}

func checkSplitInvariance(t *testing.T, in []byte, cut int, whole []*Request, wholeErr error) {
	t.Helper()
	if len(in) == 0 {
		return
	}
	cut %= len(in)
	p := NewParser(Limits{})
	a, errA := p.Feed(in[:cut])
	var b []*Request
	errB := errA
	if errA == nil {
		b, errB = p.Feed(in[cut:])
	}
	got := append(a, b...)
	if (errB == nil) != (wholeErr == nil) || len(got) != len(whole) {
		t.Fatalf("cut at %d: %d requests, err %v; whole: %d requests, err %v", cut, len(got), errB, len(whole), wholeErr)
	}
	for i := range got {
		if got[i].Start != whole[i].Start || got[i].HeadLen != whole[i].HeadLen || got[i].Target != whole[i].Target {
			t.Fatalf("cut at %d: request %d = %+v, whole %+v", cut, i, *got[i], *whole[i])
		}
	}
}

// checkAgainstNetHTTP reads the stream with net/http.ReadRequest, each
// body drained as a server would, and compares the requests both read.
func checkAgainstNetHTTP(t *testing.T, in []byte, ours []*Request) {
	t.Helper()
	// net/http's ReadRequest does not skip the blank lines RFC 9112
	// lets a server skip before a request line; the parser does.
	br := bufio.NewReader(bytes.NewReader(in))
	for i, want := range ours {
		skipBlankLines(br)
		req, err := http.ReadRequest(br)
		if err != nil {
			// net/http refuses what the parser took: stricter, not a
			// disagreement on framing.
			return
		}
		if req.Method != want.Method || req.RequestURI != want.Target {
			t.Fatalf("request %d: net/http read %s %s, the parser %s %s", i, req.Method, req.RequestURI, want.Method, want.Target)
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return // the body is cut off by the input's end, or net/http refuses it
		}
	}
}

func skipBlankLines(br *bufio.Reader) {
	for {
		b, err := br.Peek(2)
		if err != nil || b[0] != '\r' || b[1] != '\n' {
			return
		}
		br.Discard(2)
	}
}

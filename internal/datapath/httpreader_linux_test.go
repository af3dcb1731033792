package datapath

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/testutil"
)

// Record kinds of bpf/tests/http_reader.c.
const (
	recHead  = 1
	recError = 2
	recPunt  = 3
)

// Flags of a finished head (bpf/lib/http.h).
const (
	httpFlagChunked = 0x01
	httpFlagClose   = 0x02
	httpFlagUpgrade = 0x04
	httpFlagHTTP10  = 0x08
	httpFlagNoPath  = 0x10
)

// httpReader runs bpf/lib/http.h's reader with BPF_PROG_RUN.
type httpReader struct {
	objs      httpreaderObjects
	stateSize uint32
}

// testHTTPKey is the hash key the test reader is loaded with, as a
// node's would be (SipHash-2-4's test vector key).
var testHTTPKey = l7.HashKey{0x0706050403020100, 0x0f0e0d0c0b0a0908}

// unpinnedHTTPReaderSpec is the test object's spec with maps of its own
// (lib/l7match.h pins the node's), hashing under testHTTPKey.
func unpinnedHTTPReaderSpec() (*ebpf.CollectionSpec, error) {
	spec, err := loadHttpreader()
	if err != nil {
		return nil, err
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	return spec, setHTTPHashKey(spec, testHTTPKey)
}

func loadHTTPReader(t testing.TB) *httpReader {
	t.Helper()
	testutil.RequireRoot(t)
	spec, err := unpinnedHTTPReaderSpec()
	if err != nil {
		t.Fatal(err)
	}
	r := &httpReader{stateSize: spec.Maps["weir_http_test_state"].ValueSize}
	if err := spec.LoadAndAssign(&r.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("load the HTTP reader: %+v", ve)
		}
		t.Fatalf("load the HTTP reader: %v", err)
	}
	t.Cleanup(func() { r.objs.Close() })
	// Watch header names as a node whose rules name them would, so the
	// comparisons cover the values' hashes (sameHead) and the fields the
	// reader hashes instead of skipping.
	w := l7L7HeaderWatch{Count: uint32(len(testWatchedHeaders))}
	for i, name := range testWatchedHeaders {
		w.Name[i] = l7.HeaderNameHash(testHTTPKey, name)
	}
	if err := r.objs.WeirL7HeaderWatch.Put(uint32(0), w); err != nil {
		t.Fatal(err)
	}
	return r
}

// testWatchedHeaders are the names the test reader watches: fields the
// corpus carries, some of them ones the reader reads for framing too.
var testWatchedHeaders = []string{"x-k", "accept", "user-agent", "host", "content-length", "transfer-encoding", "cookie"}

// read feeds stream to a fresh reader in the pieces cuts makes (each cut
// an offset, increasing) and returns its records.
func (r *httpReader) read(t testing.TB, stream []byte, cuts []int) []httpreaderHttpTestRecord {
	t.Helper()
	zero := uint32(0)
	if err := r.objs.WeirHttpTestState.Put(zero, make([]byte, r.stateSize)); err != nil {
		t.Fatal(err)
	}
	if err := r.objs.WeirHttpTestCount.Put(zero, uint32(0)); err != nil {
		t.Fatal(err)
	}
	prev := 0
	for _, cut := range append(cuts, len(stream)) {
		for prev < cut {
			end := min(cut, prev+2048) // BPF_PROG_RUN takes a packet within a page
			data := append(make([]byte, 14), stream[prev:end]...)
			ret, err := r.objs.HttpReaderTest.Run(&ebpf.RunOptions{Data: data})
			if err != nil || ret != 0 {
				t.Fatalf("run on bytes %d-%d: %d, %v", prev, end, ret, err)
			}
			prev = end
		}
	}
	var n uint32
	if err := r.objs.WeirHttpTestCount.Lookup(zero, &n); err != nil {
		t.Fatal(err)
	}
	out := make([]httpreaderHttpTestRecord, n)
	for i := range out {
		if err := r.objs.WeirHttpTestOut.Lookup(uint32(i), &out[i]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// compareReaders holds the kernel reader's records to internal/l7's
// parser on one stream: the same heads (start, length, method, path and
// host hashes, framing), the same refusal (Framed), and a punt only at a
// head the Go parser reads whole or refuses there.
func compareReaders(stream []byte, recs []httpreaderHttpTestRecord) error {
	reqs, perr := l7.NewParser(l7.Limits{}).Feed(stream)
	var re *l7.RequestError
	goFramed := int64(-1)
	if errors.As(perr, &re) {
		goFramed = re.Framed
	}
	for i, rec := range recs {
		switch rec.Kind {
		case recHead:
			if i >= len(reqs) {
				return fmt.Errorf("kernel read head %d at %d; the parser read %d heads (error %v)", i, rec.Start, len(reqs), perr)
			}
			if err := sameHead(reqs[i], rec); err != nil {
				return fmt.Errorf("head %d: %w", i, err)
			}
			if ok, why := l7.KernelReads(reqs[i]); !ok {
				return fmt.Errorf("head %d: the kernel read it; l7.KernelReads says it punts %s", i, why)
			}
		case recError:
			switch {
			case goFramed >= 0 && int64(rec.Start) == goFramed && i == len(reqs):
				return nil
			case goFramed < 0 && i == len(reqs) && (len(reqs) == 0 || int64(rec.Start) > reqs[len(reqs)-1].Start):
				// The parser reads a head's fields at its end, the
				// kernel as they come: a head the stream ends inside
				// may be refused by the kernel only.
				return nil
			}
			return fmt.Errorf("kernel refused at %d (error %d) after %d heads; the parser read %d heads, error %v", rec.Start, rec.Error, i, len(reqs), perr)
		case recPunt:
			if i < len(reqs) && reqs[i].Start == int64(rec.Start) {
				if ok, _ := l7.KernelReads(reqs[i]); ok {
					return fmt.Errorf("kernel punted head %d (reason %d); l7.KernelReads says it reads it", i, rec.Error)
				}
				return nil
			}
			if i == len(reqs) && (goFramed == int64(rec.Start) || goFramed < 0) {
				return nil
			}
			return fmt.Errorf("kernel punted at %d (reason %d) after %d heads; the parser read %d heads, error %v", rec.Start, rec.Error, i, len(reqs), perr)
		default:
			return fmt.Errorf("record %d of kind %d", i, rec.Kind)
		}
	}
	if len(recs) != len(reqs) || goFramed >= 0 {
		return fmt.Errorf("kernel read %d heads and no refusal; the parser %d heads, error %v", len(recs), len(reqs), perr)
	}
	return nil
}

func sameHead(r *l7.Request, rec httpreaderHttpTestRecord) error {
	if int64(rec.Start) != r.Start || int(rec.HeadLen) != r.HeadLen {
		return fmt.Errorf("kernel head at %d, %d bytes; parser at %d, %d bytes", rec.Start, rec.HeadLen, r.Start, r.HeadLen)
	}
	if m := string(rec.Method[:rec.MethodLen]); m != r.Method {
		return fmt.Errorf("kernel method %q, parser %q", m, r.Method)
	}
	if (rec.Flags&httpFlagNoPath != 0) != (r.Path == "") {
		return fmt.Errorf("kernel no-path flag %v, parser path %q", rec.Flags&httpFlagNoPath != 0, r.Path)
	}
	if r.Path != "" {
		if rec.PathHash != l7.PathHash(testHTTPKey, r.Path) {
			return fmt.Errorf("kernel path hash %x, parser path %q hashes to %x", rec.PathHash, r.Path, l7.PathHash(testHTTPKey, r.Path))
		}
		want := l7.PathPrefixHashes(testHTTPKey, r.Path)
		if int(rec.Prefixes) != len(want) {
			return fmt.Errorf("kernel %d path prefixes, parser path %q has %d", rec.Prefixes, r.Path, len(want))
		}
		for i, h := range want {
			if rec.Prefix[i] != h {
				return fmt.Errorf("path %q prefix %d: kernel %x, want %x", r.Path, i, rec.Prefix[i], h)
			}
		}
	}
	labels := l7.HostLabelHashes(testHTTPKey, r.Host)
	if int(rec.Labels) != len(labels) {
		return fmt.Errorf("kernel %d host labels, parser host %q has %d", rec.Labels, r.Host, len(labels))
	}
	for i, h := range labels {
		if rec.Label[i] != h {
			return fmt.Errorf("host %q label %d: kernel %x, want %x", r.Host, i, rec.Label[i], h)
		}
	}
	if err := sameHeaders(r, rec); err != nil {
		return err
	}
	flag := func(f uint8) bool { return rec.Flags&f != 0 }
	switch {
	case flag(httpFlagChunked) != r.Chunked:
		return fmt.Errorf("kernel chunked %v, parser %v", flag(httpFlagChunked), r.Chunked)
	case !r.Chunked && rec.ContentLength != uint64(r.ContentLength):
		return fmt.Errorf("kernel content length %d, parser %d", rec.ContentLength, r.ContentLength)
	case flag(httpFlagClose) != r.Close:
		return fmt.Errorf("kernel close %v, parser %v", flag(httpFlagClose), r.Close)
	case flag(httpFlagUpgrade) != r.Upgrade:
		return fmt.Errorf("kernel upgrade %v, parser %v", flag(httpFlagUpgrade), r.Upgrade)
	case flag(httpFlagHTTP10) != (r.Proto == "HTTP/1.0"):
		return fmt.Errorf("kernel HTTP/1.0 %v, parser %s", flag(httpFlagHTTP10), r.Proto)
	}
	return nil
}

// sameHeaders holds the reader's watched fields to the parser's: a slot
// for each watched name the head carries, in the order first seen, with
// the hash of its first value, marked repeated when it came again.
func sameHeaders(r *l7.Request, rec httpreaderHttpTestRecord) error {
	type slot struct {
		name, value uint64
		dup         bool
	}
	var want []slot
	seen := map[string]bool{}
	for _, f := range r.Header {
		if seen[f.Name] || !slices.Contains(testWatchedHeaders, f.Name) {
			continue
		}
		seen[f.Name] = true
		vs := r.Values(f.Name)
		want = append(want, slot{l7.HeaderNameHash(testHTTPKey, f.Name), l7.HeaderValueHash(testHTTPKey, vs[0]), len(vs) > 1})
	}
	if int(rec.HdrSeen) != len(want) {
		return fmt.Errorf("kernel kept %d watched fields, the parser's head has %d", rec.HdrSeen, len(want))
	}
	for i, w := range want {
		got := slot{rec.HdrName[i], rec.HdrVal[i], rec.HdrDup&(1<<i) != 0}
		if got != w {
			return fmt.Errorf("watched field %d: kernel %+v, parser %+v", i, got, w)
		}
	}
	return nil
}

// readerCorpus is every stream internal/l7's tests use: its smuggling
// corpus and the heads of its table tests.
func readerCorpus(t testing.TB) [][]byte {
	t.Helper()
	out := testutil.SmugglingStreams(t)
	for _, s := range []string{
		"GET /a/b?x=1 HTTP/1.1\r\nHost: Example.COM:8080\r\nAccept: */*\r\n\r\n",
		"\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET /%61pi/v%31;jsessionid=1/%c3%a9 HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n",
		"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n",
		"GET http://API.example.com:80?q HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: [::1]:8080\r\nConnection: close\r\n\r\n",
		"GET /a/ HTTP/1.1\r\nHost: a.b.example.com.\r\n\r\nGET /a/;x/b HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
		"POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n5;name=\"v\"\r\nhello\r\n10\r\n0123456789abcdef\r\n0\r\nX-Sum: 1\r\n\r\nGET /next HTTP/1.1\r\nHost: h\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0003\r\n\r\nabcGET / HTTP/1.1\r\nHost: h\r\n\r\n",
	} {
		out = append(out, []byte(s))
	}
	// Heads at the limit and one byte over it, their long value read in
	// runs (lib/http.h's http_take_value).
	for _, v := range []int{16352, 16353} {
		out = append(out, []byte("GET / HTTP/1.1\r\nHost: h\r\nX: "+strings.Repeat("a", v)+"\r\n\r\n"))
	}
	return out
}

// TestHTTPReaderMatchesParser holds the kernel reader to internal/l7's
// parser on the corpus, each stream whole and cut at every byte into two
// runs (a head split over two skbs), then on mutated streams.
func TestHTTPReaderMatchesParser(t *testing.T) {
	r := loadHTTPReader(t)
	seen := map[uint8]int{}
	check := func(stream []byte, cuts []int) {
		t.Helper()
		recs := r.read(t, stream, cuts)
		if err := compareReaders(stream, recs); err != nil {
			t.Fatalf("stream %q cut at %v: %v", stream, cuts, err)
		}
		for _, rec := range recs {
			seen[rec.Kind]++
		}
	}
	corpus := readerCorpus(t)
	for _, s := range corpus {
		check(s, nil)
		for cut := 1; cut < len(s); cut++ {
			// Long heads: every 97th byte and the last 40, where the limit
			// decides.
			if len(s) > 512 && cut%97 != 0 && cut < len(s)-40 {
				continue
			}
			check(s, []int{cut})
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	mutations := 20000
	if n, err := strconv.Atoi(os.Getenv("WEIR_HTTP_MUTATIONS")); err == nil {
		mutations = n // a longer run by hand
	}
	for i := 0; i < mutations; i++ {
		s := mutateStream(rng, corpus[rng.IntN(len(corpus))])
		var cuts []int
		for c := 1; c < len(s); c++ {
			if rng.IntN(16) == 0 {
				cuts = append(cuts, c)
			}
		}
		check(s, cuts)
	}
	t.Logf("records compared: %d heads, %d refusals, %d punts", seen[recHead], seen[recError], seen[recPunt])
	if seen[recHead] < 1000 || seen[recError] < 1000 || seen[recPunt] < 10 {
		t.Fatalf("too few of some record kind to mean much: %v", seen)
	}
}

// mutateStream changes a stream the ways framing bugs hide in: bytes
// swapped for syntax characters, bytes dropped or doubled, pieces of
// other requests spliced in.
func mutateStream(rng *rand.Rand, s []byte) []byte {
	out := bytes.Clone(s)
	alphabet := []byte("\r\n \t:;,/.%?#*0123456789abcdefxXHTP-_[]\x00\x7f\xc3\xa9")
	for n := 1 + rng.IntN(3); n > 0 && len(out) > 0; n-- {
		i := rng.IntN(len(out))
		switch rng.IntN(4) {
		case 0:
			out[i] = alphabet[rng.IntN(len(alphabet))]
		case 1:
			out = append(out[:i], out[i+1:]...)
		case 2:
			out = append(out[:i], append([]byte{out[i]}, out[i:]...)...)
		default:
			piece := []string{"\r\n", "Transfer-Encoding: chunked\r\n", "Content-Length: 5\r\n", "Host: x\r\n",
				"GET /a HTTP/1.1\r\n", "0\r\n\r\n", "%2e", "/..", ";p", "Connection: close, upgrade\r\nUpgrade: h2c\r\n"}[rng.IntN(10)]
			out = append(out[:i], append([]byte(piece), out[i:]...)...)
		}
	}
	return out
}

// FuzzHTTPReader is TestHTTPReaderMatchesParser for as long as you let it:
// `go test -fuzz FuzzHTTPReader ./internal/datapath` (as root).
func FuzzHTTPReader(f *testing.F) {
	r := loadHTTPReader(f)
	for _, s := range readerCorpus(f) {
		f.Add(s, uint16(len(s)/2))
	}
	f.Fuzz(func(t *testing.T, s []byte, cut uint16) {
		if len(s) > 16<<10 {
			return
		}
		var cuts []int
		if len(s) > 1 {
			cuts = []int{1 + int(cut)%(len(s)-1)}
		}
		if err := compareReaders(s, r.read(t, s, cuts)); err != nil {
			t.Fatalf("stream %q cut at %v: %v", s, cuts, err)
		}
	})
}

// TestL7JudgeMatchesKernelRules holds bpf/lib/l7match.h to
// l7.KernelRules.Judge (itself held to the matcher): random rule sets
// written through l7Tables, random requests read by the kernel reader,
// the same verdict.
func TestL7JudgeMatchesKernelRules(t *testing.T) {
	testutil.RequireRoot(t)
	spec, err := unpinnedHTTPReaderSpec()
	if err != nil {
		t.Fatal(err)
	}
	const set = 7
	if err := spec.Variables["TEST_SET"].Set(uint32(set)); err != nil {
		t.Fatal(err)
	}
	r := &httpReader{stateSize: spec.Maps["weir_http_test_state"].ValueSize}
	if err := spec.LoadAndAssign(&r.objs, nil); err != nil {
		t.Fatal(err)
	}
	defer r.objs.Close()
	tables, err := openL7Tables(r.objs.WeirL7Match, r.objs.WeirL7Sets, r.objs.WeirL7HeaderWatch, r.objs.WeirL7Dfa)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	counts := map[l7.KernelVerdict]int{}
	for iter := 0; iter < 3000; iter++ {
		rules := make([]l7.Rule, 1+rng.IntN(6))
		for i := range rules {
			if rng.IntN(2) == 0 {
				rules[i].Method = pick("GET", "POST", "OPTIONS")
			}
			switch rng.IntN(5) {
			case 0:
				rules[i].Path = &l7.PathMatch{Type: l7.PathExact, Value: pick("/", "/a", "/a/b", "/%C3%A9")}
			case 1:
				rules[i].Path = &l7.PathMatch{Type: l7.PathPrefix, Value: pick("/", "/a", "/a/", "/a/b")}
			case 2:
				rules[i].Path = &l7.PathMatch{Type: l7.PathRegularExpression,
					Value: pick("/a.*", "/a/[a-z]+", "(?i)/A/B", "/x|/ab", "/%C3%A9", "/[^/]*", "/a\\b.*", "(/a)+/?")}
			}
			if rng.IntN(3) == 0 {
				rules[i].Hostnames = []string{pick("api.example.com", "*.example.com", "*.b.example.com")}
			}
			if rng.IntN(3) == 0 {
				rules[i].Headers = randHeaderMatches(rng)
			}
		}
		k, err := l7.CompileKernel(rules, testHTTPKey)
		if err != nil {
			t.Fatal(err)
		}
		if err := tables.writeSet(set, k); err != nil {
			t.Fatal(err)
		}
		for j := 0; j < 8; j++ {
			method, target := pick("GET", "POST", "OPTIONS"), pick("/", "/a", "/a/", "/a/b", "/ab", "/a/b/c", "/%c3%a9", "/x", "*")
			if target == "*" {
				method = "OPTIONS"
			}
			head := method + " " + target + " HTTP/1.1\r\nHost: " + pick("api.example.com", "a.b.example.com", "example.com", "API.EXAMPLE.com.:8080", "[::1]") + "\r\n" +
				randHeaderFields(rng) + "\r\n"
			reqs, err := l7.NewParser(l7.Limits{}).Feed([]byte(head))
			if err != nil {
				t.Fatal(err)
			}
			recs := r.read(t, []byte(head), nil)
			if len(recs) != 1 || recs[0].Kind != recHead {
				t.Fatalf("%q: records %+v", head, recs)
			}
			want, rule := k.JudgeRule(reqs[0])
			if want == l7.KernelRefuse {
				// The test program records the judge's verdict; the
				// refusal itself is l7_step's (TestL7HTTP*).
				if got := l7.KernelVerdict(recs[0].Verdict); got != want {
					t.Fatalf("rules %+v, %q: kernel %d, KernelRules.Judge refuses", rules, head, got)
				}
				counts[want]++
				continue
			}
			if got := l7.KernelVerdict(recs[0].Verdict); got != want {
				t.Fatalf("rules %+v, %q: kernel %d, KernelRules.Judge %d", rules, head, got, want)
			}
			if want == l7.KernelAllow && int(recs[0].Rule) != rule {
				t.Fatalf("rules %+v, %q: kernel names rule %d, KernelRules.JudgeRule %d", rules, head, recs[0].Rule, rule)
			}
			// The record's Host text is where the reader says it is.
			at, n := int(recs[0].HostAt), int(recs[0].HostLen)
			if host := strings.TrimSuffix(head[at:at+n], "."); !strings.EqualFold(host, reqs[0].Host) {
				t.Fatalf("%q: host at %d+%d is %q, the parser's %q", head, at, n, host, reqs[0].Host)
			}
			counts[want]++
		}
		if err := tables.deleteSet(set, k); err != nil {
			t.Fatal(err)
		}
		if n := mapLen(t, r.objs.WeirL7Match) + mapLen(t, r.objs.WeirL7Sets); n != 0 {
			t.Fatalf("deleteSet left %d entries", n)
		}
		if n := tables.dfa.held(); n != 0 {
			t.Fatalf("deleteSet left %d automaton rows held", n)
		}
		var w l7L7HeaderWatch
		if err := r.objs.WeirL7HeaderWatch.Lookup(uint32(0), &w); err != nil || w.Count != 0 {
			t.Fatalf("deleteSet left %d watched header names (%v)", w.Count, err)
		}
	}
	t.Logf("verdicts: %v", counts)
	for _, v := range []l7.KernelVerdict{l7.KernelAllow, l7.KernelDeny, l7.KernelUserSpace, l7.KernelRefuse} {
		if counts[v] < 100 {
			t.Errorf("only %d verdicts %d", counts[v], v)
		}
	}
	// No row, no verdict but deny: a set not written yet is closed.
	recs := r.read(t, []byte("GET / HTTP/1.1\r\nHost: h\r\n\r\n"), nil)
	if len(recs) != 1 || recs[0].Verdict != uint8(l7.KernelDeny) {
		t.Fatalf("with no set row: %+v, want deny", recs)
	}
}

// randHeaderMatches are a rule's header conditions: one to three names,
// each once, of every type, their values among those randHeaderFields
// sends.
func randHeaderMatches(rng *rand.Rand) []l7.HeaderMatch {
	var out []l7.HeaderMatch
	for _, name := range rng.Perm(3)[:1+rng.IntN(3)] {
		h := l7.HeaderMatch{Name: []string{"X-K", "x-user", "Accept"}[name]}
		switch rng.IntN(4) {
		case 0:
			h.Type = l7.HeaderPresent
		case 1:
			h.Type, h.Value = l7.HeaderRegularExpression, "[a-z]+"
		default:
			h.Type, h.Value = l7.HeaderExact, []string{"1", "2", "a b", "A"}[rng.IntN(4)]
		}
		out = append(out, h)
	}
	return out
}

// randHeaderFields are a head's fields of the names randHeaderMatches
// names, in any case, absent, once or twice, their values differing by
// case and inner whitespace and padded with OWS.
func randHeaderFields(rng *rand.Rand) string {
	var b strings.Builder
	for _, name := range []string{"X-K", "X-User", "accept", "Other"} {
		n := []int{0, 1, 1, 1, 2}[rng.IntN(5)]
		if n == 2 && rng.IntN(3) != 0 {
			n = 1
		}
		for i := 0; i < n; i++ {
			if rng.IntN(2) == 0 {
				name = strings.ToUpper(name)
			}
			pad := []string{"", " ", "\t ", "  "}
			b.WriteString(name + ":" + pad[rng.IntN(4)] + []string{"1", "2", "a b", "a  b", "A", "a"}[rng.IntN(6)] + pad[rng.IntN(4)] + "\r\n")
		}
	}
	return b.String()
}

func mapLen(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	n := 0
	it := m.Iterate()
	var k, v []byte
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// BenchmarkHTTPReaderHead times bpf/lib/http.h's reader alone (the
// test program: the head loaded once, then stepped a byte a bpf_loop
// iteration, hashed and recorded) over heads under BPF_PROG_RUN's own
// repeat, each run one head after the last on one stream: against bench
// l7's l7_http_verdict per request, it says how much of the verdict's
// time is the reader's. Run: sudo go test ./internal/datapath -run '^$'
// -bench HTTPReaderHead.
func BenchmarkHTTPReaderHead(b *testing.B) {
	for _, tc := range []struct{ name, head string }{
		{"wrk", "GET / HTTP/1.1\r\nHost: 10.244.0.5:8080\r\n\r\n"},
		{"browser", "GET /api/v1/orders/42?x=1 HTTP/1.1\r\nHost: shop.example.com\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64)\r\n" +
			"Accept: text/html,application/xhtml+xml\r\nAccept-Language: en-US,en;q=0.5\r\nCookie: session=0123456789abcdef\r\n\r\n"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r := loadHTTPReader(b)
			zero := uint32(0)
			if err := r.objs.WeirHttpTestState.Put(zero, make([]byte, r.stateSize)); err != nil {
				b.Fatal(err)
			}
			data := append(make([]byte, 14), tc.head...)
			b.ResetTimer()
			ret, per, err := r.objs.HttpReaderTest.Benchmark(data, b.N, nil)
			if err != nil || ret != 0 {
				b.Fatalf("run: %d, %v", ret, err)
			}
			b.ReportMetric(float64(per.Nanoseconds()), "ns/head")
			b.ReportMetric(float64(per.Nanoseconds())/float64(len(tc.head)), "ns/byte")
		})
	}
}

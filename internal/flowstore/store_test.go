package flowstore_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/flowstore"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// flow is a denied connection from peer's source port, at t0+at.
func flow(peer uint32, srcPort int, at time.Duration) api.Flow {
	return api.Flow{
		Time: t0.Add(at), Node: "n1", Verdict: "denied", Direction: "ingress", Pod: "demo/backend",
		Src: fmt.Sprintf("10.244.1.2:%d", srcPort), Dst: "10.244.2.3:80", Proto: "TCP",
		Peer: "demo/frontend", PeerIdentity: peer, PeerLabels: []string{"k8s:app=frontend"},
		Rule: "default deny",
	}
}

// open opens a store whose window never ends by itself unless o says so:
// tests write with Flush.
func open(t *testing.T, dir string, o flowstore.Options) *flowstore.Store {
	t.Helper()
	if o.Window == 0 {
		o.Window = time.Hour
	}
	s, err := flowstore.Open(dir, o)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func query(t *testing.T, s *flowstore.Store, q flowstore.Query) []api.Flow {
	t.Helper()
	got, err := s.Query(q)
	if err != nil {
		t.Fatalf("query: %v", err)
	}
	return got
}

func flush(t *testing.T, s *flowstore.Store) {
	t.Helper()
	if err := s.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
}

func closeStore(t *testing.T, s *flowstore.Store) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// peers lists the records' peer identities, in order.
func peers(flows []api.Flow) []uint32 {
	out := []uint32{}
	for _, f := range flows {
		out = append(out, f.PeerIdentity)
	}
	return out
}

// summary is what tests compare of a record, times as offsets from t0.
func summary(f api.Flow) string {
	out := fmt.Sprintf("%s %s %s->%s %s peer %d %q x%d %v..%v", f.Direction, f.Verdict, f.Src, f.Dst, f.Proto,
		f.PeerIdentity, f.Rule, f.Count, f.Time.Sub(t0), f.LastTime.Sub(t0))
	if f.Stage != "" {
		out += " " + f.Stage
	}
	if f.Decider != nil {
		out += fmt.Sprintf(" decider %s[%d]", f.Decider.Name, f.Decider.Index)
	}
	if f.LoggedBy != nil {
		out += " logged by " + f.LoggedBy.Name
	}
	if f.PassedBy != nil {
		out += " passed by " + f.PassedBy.Name
	}
	return out
}

func summaries(flows []api.Flow) []string {
	out := []string{}
	for _, f := range flows {
		out = append(out, summary(f))
	}
	return out
}

func segmentNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".jsonl") {
			names = append(names, e.Name())
		}
	}
	return names
}

func TestAddAggregatesEveryPortOfASource(t *testing.T) {
	s := open(t, t.TempDir(), flowstore.Options{})
	s.Add(flow(300, 40000, 0))
	s.Add(flow(300, 40001, 2*time.Second))
	s.Add(flow(300, 40002, time.Second))
	other := flow(300, 40003, 3*time.Second)
	other.Dst = "10.244.2.3:443"
	s.Add(other)
	allowed := flow(300, 40004, 4*time.Second)
	allowed.Verdict, allowed.Rule = "allowed", "networkpolicy demo/allow-web ingress[0]"
	s.Add(allowed)
	s.Add(flow(301, 40005, 5*time.Second))
	egress := flow(300, 40006, 6*time.Second)
	egress.Direction = "egress"
	s.Add(egress)
	s.Add(egress)
	// The rules behind a verdict tell records apart too: the same text
	// may come from another rule, or another rule may have logged it.
	decided := flow(300, 40007, 7*time.Second)
	decided.Stage, decided.Rule = "admin", "guard"
	decided.Decider = &api.FlowRule{Kind: "WeirClusterNetworkPolicy", Name: "guard", Tier: "Admin", Direction: "ingress", Action: "Deny"}
	s.Add(decided)
	other2 := decided
	other2.Src, other2.Time = "10.244.1.2:40008", t0.Add(8*time.Second)
	other2.Decider = &api.FlowRule{Kind: "WeirClusterNetworkPolicy", Name: "guard", Tier: "Admin", Direction: "ingress", Index: 1, Action: "Deny"}
	s.Add(other2)
	logged := decided
	logged.Time = t0.Add(9 * time.Second)
	logged.LoggedBy = &api.FlowRule{Kind: "ClusterNetworkPolicy", Name: "audit", Direction: "ingress", Action: "Log"}
	s.Add(logged)
	passed := decided
	passed.Time = t0.Add(10 * time.Second)
	passed.PassedBy = &api.FlowRule{Kind: "ClusterNetworkPolicy", Name: "pass", Direction: "ingress", Action: "Pass"}
	s.Add(passed)
	again := decided
	again.Decider = &api.FlowRule{Kind: "WeirClusterNetworkPolicy", Name: "guard", Tier: "Admin", Direction: "ingress", Action: "Deny"}
	again.Src, again.Time = "10.244.1.2:40009", t0.Add(12*time.Second)
	s.Add(again) // an equal rule, not the same pointer
	baseline := decided
	baseline.Stage, baseline.Time = "baseline", t0.Add(11*time.Second)
	s.Add(baseline)

	want := []string{
		`ingress denied 10.244.1.2->10.244.2.3:80 TCP peer 300 "default deny" x3 0s..2s`,
		`ingress denied 10.244.1.2->10.244.2.3:443 TCP peer 300 "default deny" x1 3s..3s`,
		`ingress allowed 10.244.1.2->10.244.2.3:80 TCP peer 300 "networkpolicy demo/allow-web ingress[0]" x1 4s..4s`,
		`ingress denied 10.244.1.2->10.244.2.3:80 TCP peer 301 "default deny" x1 5s..5s`,
		`egress denied 10.244.1.2->10.244.2.3:80 TCP peer 300 "default deny" x2 6s..6s`,
		`ingress denied 10.244.1.2->10.244.2.3:80 TCP peer 300 "guard" x1 8s..8s admin decider guard[1]`,
		`ingress denied 10.244.1.2->10.244.2.3:80 TCP peer 300 "guard" x1 9s..9s admin decider guard[0] logged by audit`,
		`ingress denied 10.244.1.2->10.244.2.3:80 TCP peer 300 "guard" x1 10s..10s admin decider guard[0] passed by pass`,
		`ingress denied 10.244.1.2->10.244.2.3:80 TCP peer 300 "guard" x1 11s..11s baseline decider guard[0]`,
		`ingress denied 10.244.1.2->10.244.2.3:80 TCP peer 300 "guard" x2 7s..12s admin decider guard[0]`,
	}
	if got := summaries(query(t, s, flowstore.Query{})); !slices.Equal(got, want) {
		t.Fatalf("window holds\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if st := s.Stats(); st.Pending != len(want) || st.Flows != 0 || st.Bytes != 0 {
		t.Fatalf("before a write: %+v", st)
	}
	flush(t, s)
	got := query(t, s, flowstore.Query{})
	if !slices.Equal(summaries(got), want) {
		t.Fatalf("segment holds\n%s\nwant\n%s", strings.Join(summaries(got), "\n"), strings.Join(want, "\n"))
	}
	if got[0].Node != "n1" || got[0].Pod != "demo/backend" || got[0].Peer != "demo/frontend" || !slices.Equal(got[0].PeerLabels, []string{"k8s:app=frontend"}) {
		t.Fatalf("record lost its names: %+v", got[0])
	}
	if st := s.Stats(); st.Pending != 0 || st.Flows != uint64(len(want)) || st.Segments != 1 || st.Bytes == 0 {
		t.Fatalf("after a write: %+v", st)
	}
}

func TestAddCountsAggregatesAndUntimedFlows(t *testing.T) {
	now := t0.Add(time.Minute)
	s := open(t, t.TempDir(), flowstore.Options{Now: func() time.Time { return now }})
	agg := flow(300, 0, 10*time.Second)
	agg.Src, agg.Count, agg.LastTime = "10.244.1.2", 7, t0.Add(20*time.Second)
	s.Add(agg)
	untimed := flow(300, 40000, 0)
	untimed.Time = time.Time{}
	s.Add(untimed)
	want := []string{`ingress denied 10.244.1.2->10.244.2.3:80 TCP peer 300 "default deny" x8 10s..1m0s`}
	if got := summaries(query(t, s, flowstore.Query{})); !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestReopenKeepsFlowsAndContinuesTheSequence(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, flowstore.Options{})
	s.Add(flow(1, 40000, 0))
	s.Add(flow(2, 40000, time.Second))
	closeStore(t, s) // writes the window
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	s.Add(flow(99, 40000, 0)) // dropped: the store is closed
	if got := segmentNames(t, dir); !slices.Equal(got, []string{"000000000001.jsonl"}) {
		t.Fatalf("segments %v", got)
	}

	s = open(t, dir, flowstore.Options{})
	if got := peers(query(t, s, flowstore.Query{})); !slices.Equal(got, []uint32{1, 2}) {
		t.Fatalf("after a restart: peers %v, want [1 2]", got)
	}
	s.Add(flow(3, 40000, 2*time.Second))
	closeStore(t, s)
	if got := segmentNames(t, dir); !slices.Equal(got, []string{"000000000001.jsonl", "000000000002.jsonl"}) {
		t.Fatalf("segments %v", got)
	}

	s = open(t, dir, flowstore.Options{})
	if got := peers(query(t, s, flowstore.Query{})); !slices.Equal(got, []uint32{1, 2, 3}) {
		t.Fatalf("after a second restart: peers %v, want [1 2 3]", got)
	}
	if st := s.Stats(); st.Segments != 2 || st.Flows != 0 || st.TornLines != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// lineBytes is the size of a single flow's record on disk.
func lineBytes(t *testing.T, f api.Flow) int64 {
	t.Helper()
	f.Src, f.Count, f.LastTime = "10.244.1.2", 1, f.Time
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return int64(len(b)) + 1
}

func TestSizeBoundDropsTheOldestFirst(t *testing.T) {
	dir := t.TempDir()
	// Peers 100-108 at 0-8 s: every record has the same size.
	l := lineBytes(t, flow(100, 1, 0))
	s := open(t, dir, flowstore.Options{SegmentBytes: 2 * l, MaxBytes: 5 * l})
	for i := range 9 {
		s.Add(flow(uint32(100+i), 40000, time.Duration(i)*time.Second))
		flush(t, s)
	}
	// Segments of two records: [100 101] [102 103] [104 105] [106 107]
	// [108]; the first two go to stay within five records.
	if got := peers(query(t, s, flowstore.Query{})); !slices.Equal(got, []uint32{104, 105, 106, 107, 108}) {
		t.Fatalf("kept peers %v, want 104-108", got)
	}
	st := s.Stats()
	if st.Segments != 3 || st.Bytes != 5*l || st.DroppedSegments != 2 || st.DroppedBytes != uint64(4*l) || st.Flows != 9 {
		t.Fatalf("stats %+v, want 3 segments of %d bytes, 2 dropped of %d", st, 5*l, 4*l)
	}
	want := []string{"000000000003.jsonl", "000000000004.jsonl", "000000000005.jsonl"}
	if got := segmentNames(t, dir); !slices.Equal(got, want) {
		t.Fatalf("segments %v, want %v", got, want)
	}
	closeStore(t, s)

	// A smaller bound applies at the next Open.
	s = open(t, dir, flowstore.Options{SegmentBytes: l, MaxBytes: 2 * l})
	if got := peers(query(t, s, flowstore.Query{})); !slices.Equal(got, []uint32{108}) {
		t.Fatalf("after lowering the bound: peers %v, want [108]", got)
	}
	if st := s.Stats(); st.DroppedSegments != 2 || st.Bytes != l {
		t.Fatalf("after lowering the bound: %+v", st)
	}
}

func TestTornLastLineIsSkipped(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, flowstore.Options{})
	s.Add(flow(1, 40000, 0))
	s.Add(flow(2, 40000, time.Second))
	closeStore(t, s)
	// A crash mid-write leaves part of a line; damage elsewhere leaves a
	// line that is not JSON. Neither stops the store.
	seg, err := os.OpenFile(filepath.Join(dir, "000000000001.jsonl"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := seg.WriteString(`{"time":"2025-01-02T03:04:07Z","node":"n1","verd`); err != nil {
		t.Fatal(err)
	}
	seg.Close()
	first, err := json.Marshal(flow(0, 40000, -time.Second))
	if err != nil {
		t.Fatal(err)
	}
	corrupt := "not json\n" + string(first) + "\n\x00\x00\x00\n"
	if err := os.WriteFile(filepath.Join(dir, "000000000000.jsonl"), []byte(corrupt), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not a segment"), 0o640); err != nil {
		t.Fatal(err)
	}

	s = open(t, dir, flowstore.Options{})
	if st := s.Stats(); st.TornLines != 1 || st.Segments != 2 {
		t.Fatalf("stats %+v, want 1 torn line in 2 segments", st)
	}
	if got := peers(query(t, s, flowstore.Query{})); !slices.Equal(got, []uint32{0, 1, 2}) {
		t.Fatalf("peers %v, want [0 1 2]", got)
	}
	s.Add(flow(3, 40000, 2*time.Second))
	closeStore(t, s)

	s = open(t, dir, flowstore.Options{})
	if got := peers(query(t, s, flowstore.Query{})); !slices.Equal(got, []uint32{0, 1, 2, 3}) {
		t.Fatalf("after another restart: peers %v, want [0 1 2 3]", got)
	}
	if got := segmentNames(t, dir); !slices.Equal(got, []string{"000000000000.jsonl", "000000000001.jsonl", "000000000002.jsonl"}) {
		t.Fatalf("segments %v: the torn one must not be appended to", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "notes.txt")); err != nil {
		t.Fatalf("a file not the store's was touched: %v", err)
	}
}

func TestQuerySinceMatchLimit(t *testing.T) {
	s := open(t, t.TempDir(), flowstore.Options{})
	for i := range 4 {
		s.Add(flow(uint32(i+1), 40000, time.Duration(i)*time.Second))
		if i%2 == 1 {
			flush(t, s) // [1 2] and [3 4] on disk
		}
	}
	// In memory: 5 first seen at 0 s but last at 4 s, and 6.
	s.Add(flow(5, 40000, 0))
	s.Add(flow(5, 40001, 4*time.Second))
	s.Add(flow(6, 40000, 5*time.Second))
	even := func(f api.Flow) bool { return f.PeerIdentity%2 == 0 }
	for _, tc := range []struct {
		name string
		q    flowstore.Query
		want []uint32
	}{
		{"all", flowstore.Query{}, []uint32{1, 2, 3, 4, 5, 6}},
		{"newest of memory", flowstore.Query{Limit: 1}, []uint32{6}},
		{"newest across memory and disk", flowstore.Query{Limit: 3}, []uint32{4, 5, 6}},
		{"newest across segments", flowstore.Query{Limit: 5}, []uint32{2, 3, 4, 5, 6}},
		{"limit above all", flowstore.Query{Limit: 100}, []uint32{1, 2, 3, 4, 5, 6}},
		{"since, by last seen", flowstore.Query{Since: t0.Add(3 * time.Second)}, []uint32{4, 5, 6}},
		{"since the start", flowstore.Query{Since: t0}, []uint32{1, 2, 3, 4, 5, 6}},
		{"since after all", flowstore.Query{Since: t0.Add(time.Hour)}, []uint32{}},
		{"match", flowstore.Query{Match: even}, []uint32{2, 4, 6}},
		{"match and limit", flowstore.Query{Match: even, Limit: 2}, []uint32{4, 6}},
		{"since and limit", flowstore.Query{Since: t0.Add(time.Second), Limit: 10}, []uint32{2, 3, 4, 5, 6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := peers(query(t, s, tc.q)); !slices.Equal(got, tc.want) {
				t.Fatalf("peers %v, want %v", got, tc.want)
			}
		})
	}
}

func TestOpenRejectsBadOptions(t *testing.T) {
	for _, tc := range []struct {
		opts flowstore.Options
		want string
	}{
		{flowstore.Options{MaxBytes: -1}, "Options.MaxBytes -1 is negative"},
		{flowstore.Options{SegmentBytes: -1}, "Options.SegmentBytes -1 is negative"},
		{flowstore.Options{Window: -time.Second}, "Options.Window -1s is negative"},
		{flowstore.Options{MaxWindowFlows: -1}, "Options.MaxWindowFlows -1 is negative"},
		{flowstore.Options{MaxBytes: 1000, SegmentBytes: 2000}, "Options.SegmentBytes 2000 is above Options.MaxBytes 1000: lower SegmentBytes or raise MaxBytes"},
		{flowstore.Options{SegmentBytes: flowstore.DefaultMaxBytes + 1}, "is above Options.MaxBytes 67108864"},
	} {
		dir := filepath.Join(t.TempDir(), "flows")
		s, err := flowstore.Open(dir, tc.opts)
		if err == nil {
			s.Close()
			t.Fatalf("%+v: opened", tc.opts)
		}
		if !errors.Is(err, flowstore.ErrInvalidOptions) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%+v: error %q, want ErrInvalidOptions and %q", tc.opts, err, tc.want)
		}
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%+v: directory created for a store that did not open (%v)", tc.opts, err)
		}
	}
}

func TestOpenCreatesItsDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "var", "lib", "weir", "flows")
	// A small bound alone is valid: segments default to an eighth of it.
	s := open(t, dir, flowstore.Options{MaxBytes: 800})
	info, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	// 0750 less the umask: flows name pods and peers, not for everyone.
	if !info.IsDir() || info.Mode().Perm()&0o027 != 0 {
		t.Fatalf("directory mode %v, want at most 0750", info.Mode())
	}
	for i := range 20 {
		s.Add(flow(uint32(100+i), 40000, time.Duration(i)*time.Second))
		flush(t, s)
	}
	if st := s.Stats(); st.Bytes > 800 || st.Segments < 2 || st.DroppedSegments == 0 {
		t.Fatalf("stats %+v: want at most 800 bytes in several segments, the oldest dropped", st)
	}
}

func TestFailedWriteLosesOnlyItsWindow(t *testing.T) {
	dir := t.TempDir()
	// Something not a segment holds the next segment's name.
	if err := os.Mkdir(filepath.Join(dir, "000000000001.jsonl"), 0o750); err != nil {
		t.Fatal(err)
	}
	s := open(t, dir, flowstore.Options{})
	s.Add(flow(1, 40000, 0))
	if err := s.Flush(); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("flush over a taken name: %v, want ErrExist", err)
	}
	s.Add(flow(2, 40000, time.Second))
	flush(t, s)
	if got := peers(query(t, s, flowstore.Query{})); !slices.Equal(got, []uint32{2}) {
		t.Fatalf("peers %v, want [2]", got)
	}
	if st := s.Stats(); st.WriteErrors != 1 || st.Flows != 1 || st.Segments != 1 {
		t.Fatalf("stats %+v", st)
	}
	if _, err := os.Stat(filepath.Join(dir, "000000000002.jsonl")); err != nil {
		t.Fatalf("the next write did not start the next segment: %v", err)
	}
}

// waitFor polls cond for up to five seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestBackgroundWriterWritesEachWindow(t *testing.T) {
	s := open(t, t.TempDir(), flowstore.Options{Window: 10 * time.Millisecond})
	s.Add(flow(1, 40000, 0))
	waitFor(t, "the first window's write", func() bool { return s.Stats().Flows == 1 })
	s.Add(flow(1, 40001, time.Second))
	waitFor(t, "the second window's write", func() bool { return s.Stats().Flows == 2 })
	if st := s.Stats(); st.Pending != 0 || st.Segments != 1 {
		t.Fatalf("stats %+v", st)
	}
	// One record per window: aggregates do not span windows.
	got := query(t, s, flowstore.Query{})
	if len(got) != 2 || got[0].Count != 1 || got[1].Count != 1 {
		t.Fatalf("records %q", summaries(got))
	}
}

func TestFullWindowIsWrittenEarly(t *testing.T) {
	var errs []error
	s := open(t, t.TempDir(), flowstore.Options{MaxWindowFlows: 4, OnError: func(err error) { errs = append(errs, err) }})
	for i := range 4 {
		s.Add(flow(uint32(i), 40000, 0))
	}
	waitFor(t, "a full window's write", func() bool { return s.Stats().Flows == 4 })
	closeStore(t, s)
	if len(errs) != 0 {
		t.Fatalf("errors reported: %v", errs)
	}
}

func TestConcurrentAddsDuringWrites(t *testing.T) {
	const writers, each, distinct = 8, 2000, 50
	dir := t.TempDir()
	// Small windows and segments: writes, rotations and early writes all
	// race the adds.
	s := open(t, dir, flowstore.Options{Window: time.Millisecond, MaxWindowFlows: 16, SegmentBytes: 4096})
	var started, finished atomic.Int64
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				started.Add(1)
				s.Add(flow(uint32(i%distinct), 30000+w, time.Duration(i)*time.Millisecond))
				finished.Add(1)
			}
		})
	}
	done := make(chan struct{})
	var others sync.WaitGroup
	others.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if err := s.Flush(); err != nil {
				t.Errorf("flush: %v", err)
				return
			}
		}
	})
	for range 2 {
		others.Go(func() { checkCounts(t, s, &started, &finished, done) })
	}
	wg.Wait()
	close(done)
	others.Wait()
	closeStore(t, s)

	s = open(t, dir, flowstore.Options{})
	counts := map[uint32]uint64{}
	for _, f := range query(t, s, flowstore.Query{}) {
		counts[f.PeerIdentity] += f.Count
	}
	if len(counts) != distinct {
		t.Fatalf("%d peers, want %d", len(counts), distinct)
	}
	for p, n := range counts {
		if n != writers*each/distinct {
			t.Fatalf("peer %d counted %d times, want %d", p, n, writers*each/distinct)
		}
	}
}

// checkCounts queries s until done: every query must count each flow
// added so far once, none in neither the window nor a segment, none in
// both.
func checkCounts(t *testing.T, s *flowstore.Store, started, finished *atomic.Int64, done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		default:
		}
		before := finished.Load()
		got, err := s.Query(flowstore.Query{})
		after := started.Load()
		if err != nil {
			t.Errorf("query: %v", err)
			return
		}
		n := int64(0)
		for _, f := range got {
			n += int64(f.Count)
		}
		if n < before || n > after {
			t.Errorf("query counts %d flows, want %d-%d", n, before, after)
			return
		}
	}
}

// BenchmarkAdd is the cost the agent pays per flow: new connections and
// drops of a hundred peers, each from a new source port.
func BenchmarkAdd(b *testing.B) {
	s, err := flowstore.Open(b.TempDir(), flowstore.Options{Window: 10 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	flows := make([]api.Flow, 1000)
	for i := range flows {
		flows[i] = flow(uint32(i%100), 30000+i, time.Duration(i))
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		s.Add(flows[i%len(flows)])
	}
}

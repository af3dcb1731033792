package flowstore

import (
	"testing"
	"time"

	"github.com/weirnet/weir/internal/api"
)

func TestSrcAddrDropsOnlyAPort(t *testing.T) {
	for in, want := range map[string]string{
		"10.244.1.2:40000":   "10.244.1.2",
		"10.244.1.2:0":       "10.244.1.2",
		"[fd00::1]:40000":    "fd00::1",
		"fd00::1":            "fd00::1",
		"fd00::1:80":         "fd00::1:80", // bare IPv6: no port to drop
		"10.244.1.2":         "10.244.1.2",
		"10.244.1.2:":        "10.244.1.2:",
		"10.244.1.2:abc":     "10.244.1.2:abc",
		"10.244.1.2:1234567": "10.244.1.2:1234567",
		"":                   "",
	} {
		if got := srcAddr(in); got != want {
			t.Errorf("srcAddr(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDefaultSegmentsFitTheBound(t *testing.T) {
	for _, tc := range []struct{ max, wantSeg int64 }{
		{0, DefaultSegmentBytes},
		{DefaultMaxBytes, DefaultSegmentBytes},
		{8 << 20, 1 << 20},
		{800, 100},
		{3, 1},
	} {
		o, err := Options{MaxBytes: tc.max}.withDefaults()
		if err != nil {
			t.Fatalf("MaxBytes %d: %v", tc.max, err)
		}
		if o.SegmentBytes != tc.wantSeg || o.SegmentBytes > o.MaxBytes {
			t.Errorf("MaxBytes %d: segments of %d, want %d", tc.max, o.SegmentBytes, tc.wantSeg)
		}
	}
}

// A connection through a Service and one straight to its backend are two
// records, as are the two ways a Service can be found.
func TestServiceKeepsRecordsApart(t *testing.T) {
	base := api.Flow{Pod: "default/client", Verdict: "allowed", Src: "10.244.1.2:40000", Dst: "10.244.1.3:8080", Proto: "TCP"}
	via := base
	via.Src, via.Service, via.ServiceAddr = "10.244.1.2:40001", "default/web", "10.96.0.10:80"
	byClient := via
	byClient.ServiceByClient = true
	if keyOf(base) == keyOf(via) || keyOf(via) == keyOf(byClient) {
		t.Fatal("records through a Service share a key with others")
	}
	again := via
	again.Src = "10.244.1.2:40002"
	if keyOf(via) != keyOf(again) {
		t.Fatal("two connections through the same Service are two records")
	}
}

// Records of answers to the same request fold into one whatever their
// latencies, which the fold averages by count and whose maximum it keeps;
// the records it folds are left as they were.
func TestRepliesFoldTheirLatencies(t *testing.T) {
	at := time.Date(2026, 11, 29, 1, 0, 0, 0, time.UTC)
	reply := func(n uint64, mean, longest time.Duration) api.Flow {
		return api.Flow{Pod: "empire/deathstar-0", Verdict: "allowed", Stage: "http", Src: "10.244.2.9:40000", Dst: "10.244.1.7:80",
			Proto: "TCP", Time: at, Count: n, LastTime: at,
			HTTP: &api.FlowHTTP{Method: "GET", Target: "/v1", Status: 200, Reply: true, Latency: mean, LatencyMax: longest}}
	}
	a, b := reply(3, 2*time.Millisecond, 5*time.Millisecond), reply(1, 6*time.Millisecond, 6*time.Millisecond)
	if keyOf(a) != keyOf(b) {
		t.Fatal("answers to one request with other latencies are two records")
	}
	request := a
	request.HTTP = &api.FlowHTTP{Method: "GET", Target: "/v1"}
	if keyOf(a) == keyOf(request) {
		t.Fatal("answers share a record with their requests")
	}
	now := func() time.Time { return at }
	agg := newAggregate(a, keyOf(a), now)
	merge(agg, b, now)
	if agg.Count != 4 || agg.HTTP.Latency != 3*time.Millisecond || agg.HTTP.LatencyMax != 6*time.Millisecond {
		t.Fatalf("folded %d answers, mean %v, longest %v; want 4, 3ms, 6ms", agg.Count, agg.HTTP.Latency, agg.HTTP.LatencyMax)
	}
	if a.HTTP.Latency != 2*time.Millisecond || a.HTTP.LatencyMax != 5*time.Millisecond {
		t.Fatalf("the first record changed: %+v", a.HTTP)
	}
}

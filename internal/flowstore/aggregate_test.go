package flowstore

import (
	"testing"

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

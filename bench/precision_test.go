package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// pairedSamples are reps of the raw veth pair at 10 Gbit/s and Weir at
// 10*ratio(rep), the pair the datapath's first target divides.
func pairedSamples(reps int, ratio func(rep int) float64) []sample {
	var out []sample
	for rep := 0; rep < reps; rep++ {
		out = append(out,
			sample{Setup: setupRaw, Path: "intra", Metric: "tcp_gbps", Rep: rep, Value: 10},
			sample{Setup: setupWeir, Path: "intra", Metric: "tcp_gbps", Rep: rep, Value: 10 * ratio(rep)})
	}
	return out
}

func TestPrecisionNamesTheWidestInterval(t *testing.T) {
	tight := measurePrecision("datapath", pairedSamples(8, func(rep int) float64 { return 1 + 0.002*float64(rep%2) }), 0.03)
	if !tight.Met || tight.Widest > 0.03 {
		t.Errorf("ratios within 0.2%%: %+v, want met", tight)
	}
	noisy := measurePrecision("datapath", pairedSamples(8, func(rep int) float64 { return []float64{0.8, 1.2}[rep%2] }), 0.03)
	if noisy.Met || noisy.Widest < 0.1 || noisy.WidestTarget != "intra-node TCP throughput, Weir / raw veth" {
		t.Errorf("ratios 0.8 and 1.2: %+v, want unmet and named", noisy)
	}
}

func TestEnoughRepsStopsWhenTightOrAtTheCap(t *testing.T) {
	o := options{reps: 3, maxReps: 6, precision: 0.03}
	noisy := &result{Scenario: "datapath", Samples: pairedSamples(6, func(rep int) float64 { return []float64{0.8, 1.2}[rep%2] })}
	if enoughReps(o, noisy, 2, io.Discard) {
		t.Error("stopped before --reps")
	}
	if enoughReps(o, noisy, 4, io.Discard) {
		t.Error("stopped with a ±20% interval before --max-reps")
	}
	if !enoughReps(o, noisy, 6, io.Discard) || noisy.Reps != 6 || noisy.Precision == nil || noisy.Precision.Met {
		t.Errorf("at --max-reps: reps %d precision %+v, want a stop recorded as unmet", noisy.Reps, noisy.Precision)
	}
	tight := &result{Scenario: "datapath", Samples: pairedSamples(3, func(int) float64 { return 0.99 })}
	if !enoughReps(o, tight, 3, io.Discard) || !tight.Precision.Met {
		t.Errorf("identical ratios: precision %+v, want a stop at --reps", tight.Precision)
	}
	if !strings.Contains(noisy.precisionLine(), "Not repeatable") || !strings.Contains(tight.precisionLine(), "Repeated until") {
		t.Errorf("report lines: %q / %q", noisy.precisionLine(), tight.precisionLine())
	}
}

// TestCompareRunsFindsDisagreement: two runs agree when each median lies
// inside the other's interval, and the comparison fails otherwise.
func TestCompareRunsFindsDisagreement(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, ratio func(int) float64) string {
		r := &result{Scenario: "datapath", Command: "sudo go run ./bench datapath --reps=8", Samples: pairedSamples(8, ratio)}
		r.summarise()
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	a := write("a.json", func(rep int) float64 { return 0.95 + 0.01*float64(rep%3) })
	b := write("b.json", func(rep int) float64 { return 0.955 + 0.01*float64(rep%2) })
	far := write("far.json", func(rep int) float64 { return 0.80 + 0.01*float64(rep%2) })
	ra, rb, rows, err := compareRuns(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if n := writeComparison(io.Discard, a, b, ra, rb, rows); n != 0 {
		t.Errorf("close runs: %d disagree, want 0", n)
	}
	ra, rf, rows, err := compareRuns(a, far)
	if err != nil {
		t.Fatal(err)
	}
	if n := writeComparison(io.Discard, a, far, ra, rf, rows); n != 1 {
		t.Errorf("runs at 0.96 and 0.81: %d disagree, want 1", n)
	}
}

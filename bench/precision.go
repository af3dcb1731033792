package main

import (
	"fmt"
	"io"
	"math"
	"slices"
)

// Repetitions until the figures hold: a scenario runs at least --reps
// repetitions, then keeps adding whole repetitions until every paired
// ratio among its targets has a 95% bootstrap interval within
// ±--precision of its median, or --max-reps is reached. On this 2-vCPU
// machine a fixed, small repetition count leaves intervals 10-30% wide,
// and two runs of the same command then disagree by more than the
// differences they look for.

// precision is how tight a run's paired ratios are.
type precision struct {
	// Widest is the largest interval half-width relative to its median
	// among the paired-ratio targets, and WidestTarget names it.
	Widest       float64 `json:"widest_half_width"`
	WidestTarget string  `json:"widest_target,omitempty"`
	// Wanted is --precision; Met says Widest is within it.
	Wanted float64 `json:"wanted_half_width"`
	Met    bool    `json:"met"`
}

// precisionMetrics are the figures whose ratios to the raw veth pair the
// tables print, and so must hold too.
var precisionMetrics = []string{"tcp_gbps", "rr_avg_us", "udp_gbps", "crr_per_s"}

// pairedFigures are the paired ratios a run reports, each with its 95%
// interval: its targets' and every same-node setup's ratio to the raw veth
// pair. r must be summarised.
func (r *result) pairedFigures() []target {
	var out []target
	for _, t := range r.Targets {
		if t.CILow != 0 || t.CIHigh != 0 {
			out = append(out, t)
		}
	}
	for _, st := range r.Summary {
		if st.Path != "intra" || st.Setup == setupRaw || !slices.Contains(precisionMetrics, st.Metric) {
			continue
		}
		ratios := r.pairedRatios(st.Setup, "intra", setupRaw, "intra", st.Metric)
		if len(ratios) == 0 {
			continue
		}
		lo, hi := bootstrapMedianCI(ratios)
		fig := target{What: fmt.Sprintf("%s %s / raw veth", st.Setup, st.Metric), Got: quantile(ratios, 0.5), CILow: lo, CIHigh: hi}
		if !slices.ContainsFunc(out, func(t target) bool { return t.Got == fig.Got && t.CILow == fig.CILow && t.CIHigh == fig.CIHigh }) {
			out = append(out, fig) // not a target's ratio already
		}
	}
	return out
}

// measurePrecision judges the samples so far as the finished run would be
// judged and returns how wide their paired-ratio intervals are.
func measurePrecision(scenario string, samples []sample, wanted float64) precision {
	probe := &result{Scenario: scenario, Samples: samples}
	probe.summarise()
	p := precision{Wanted: wanted}
	for _, t := range probe.pairedFigures() {
		if t.Got == 0 || math.IsNaN(t.Got) || math.IsNaN(t.CILow) || math.IsNaN(t.CIHigh) {
			continue
		}
		if hw := halfWidth(t); hw > p.Widest {
			p.Widest, p.WidestTarget = hw, t.What
		}
	}
	p.Met = p.Widest <= wanted
	return p
}

// enoughReps reports, after rep repetitions (counting from 1), whether the
// run may stop: the minimum is done and either the intervals are tight
// enough or no more repetitions are allowed. It records the precision in
// res and says why it stops.
func enoughReps(o options, res *result, reps int, out io.Writer) bool {
	if reps < o.reps {
		return false
	}
	p := measurePrecision(res.Scenario, res.Samples, o.precision)
	res.Reps, res.Precision = reps, &p
	switch {
	case p.Met:
		fmt.Fprintf(out, "    after %d reps every paired ratio's 95%% interval is within ±%.1f%% (widest ±%.1f%%: %s)\n",
			reps, 100*o.precision, 100*p.Widest, p.WidestTarget)
		return true
	case reps >= max(o.maxReps, o.reps):
		fmt.Fprintf(out, "    stopping at --max-reps=%d: widest interval ±%.1f%% (%s), wanted ±%.1f%%\n",
			reps, 100*p.Widest, p.WidestTarget, 100*o.precision)
		return true
	}
	fmt.Fprintf(out, "    after %d reps the widest interval is ±%.1f%% (%s): another repetition\n", reps, 100*p.Widest, p.WidestTarget)
	return false
}

// precisionLine describes, for a report, how the repetition count was
// reached.
func (r *result) precisionLine() string {
	p := r.Precision
	if p == nil {
		return ""
	}
	if p.Met {
		return fmt.Sprintf("Repeated until every paired ratio's 95%% interval was within ±%.1f%% of its median: %d repetitions (widest ±%.1f%%, %s).\n",
			100*p.Wanted, r.Reps, 100*p.Widest, p.WidestTarget)
	}
	return fmt.Sprintf("**Not repeatable to ±%.1f%% within %d repetitions**: the widest paired-ratio interval is ±%.1f%% (%s); ratios whose interval spans their target are marked undecided.\n",
		100*p.Wanted, r.Reps, 100*p.Widest, p.WidestTarget)
}

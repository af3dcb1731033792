package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/weirnet/weir/internal/lab"
)

type sample struct {
	Setup  string  `json:"setup"`
	Path   string  `json:"path"`
	Metric string  `json:"metric"`
	Rep    int     `json:"rep"`
	Value  float64 `json:"value"`
}

// stat summarises the samples of one setup, path and metric.
type stat struct {
	Setup      string  `json:"setup"`
	Path       string  `json:"path"`
	Metric     string  `json:"metric"`
	N          int     `json:"n"`
	Median     float64 `json:"median"`
	P99        float64 `json:"p99"`
	Min        float64 `json:"min"`
	Max        float64 `json:"max"`
	RatioToRaw float64 `json:"ratio_to_raw,omitempty"`
	// PairedRatioToRaw is the median over repetitions of this setup's value
	// divided by the raw veth pair's in the same repetition. Setups of one
	// repetition run seconds apart, so this cancels the machine's drift
	// between repetitions, which here is larger than the differences.
	PairedRatioToRaw float64 `json:"paired_ratio_to_raw,omitempty"`
}

type target struct {
	What string  `json:"what"`
	Want string  `json:"want"`
	Got  float64 `json:"got"`
	Met  bool    `json:"met"`
	// CILow and CIHigh bound the paired ratio's 95% bootstrap interval
	// (both zero: the target is no paired ratio); Undecided says the
	// interval spans the target, so the run cannot tell either way.
	CILow     float64 `json:"ci95_low,omitempty"`
	CIHigh    float64 `json:"ci95_high,omitempty"`
	Undecided bool    `json:"undecided,omitempty"`
}

type result struct {
	Scenario  string            `json:"scenario"`
	Command   string            `json:"command"`
	Commit    string            `json:"commit,omitempty"` // the code measured
	Started   string            `json:"started"`
	Finished  string            `json:"finished"`
	Machine   map[string]string `json:"machine"`
	Reps      int               `json:"reps"`
	DurationS float64           `json:"duration_s"`
	// Precision is how tight the paired ratios came out, for runs that
	// repeat until they are tight enough (--max-reps).
	Precision *precision `json:"precision,omitempty"`
	// WarmupS is the length of the discarded warm-up run of every test on
	// every setup before the first repetition.
	WarmupS float64 `json:"warmup_s,omitempty"`
	// Incomplete says why a run stopped before its end; what it measured
	// until then is kept.
	Incomplete string   `json:"incomplete,omitempty"`
	Summary    []stat   `json:"summary"`
	Targets    []target `json:"targets"`
	Samples    []sample `json:"samples"`
}

func (r *result) summarise() {
	groups := map[[3]string][]float64{}
	var keys [][3]string
	for _, s := range r.Samples {
		k := [3]string{s.Setup, s.Path, s.Metric}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], s.Value)
	}
	for _, k := range keys {
		v := groups[k]
		sort.Float64s(v)
		r.Summary = append(r.Summary, stat{Setup: k[0], Path: k[1], Metric: k[2], N: len(v), Median: quantile(v, 0.5), P99: quantile(v, 0.99), Min: v[0], Max: v[len(v)-1]})
	}
	// Ratios to the physical limit, the raw veth pair (intra-node figures).
	for i, s := range r.Summary {
		traffic := s.Metric == "tcp_gbps" || s.Metric == "udp_gbps" || strings.HasPrefix(s.Metric, "rr_") || s.Metric == "crr_per_s"
		if raw := r.median(setupRaw, "intra", s.Metric); raw > 0 && traffic {
			r.Summary[i].RatioToRaw = s.Median / raw
			r.Summary[i].PairedRatioToRaw = r.pairedRatio(s.Setup, s.Path, setupRaw, "intra", s.Metric)
		}
	}
	r.judge()
	// A run limited by --setups or --tests lacks some pairs; their
	// targets are NaN, which JSON cannot carry, and say nothing.
	r.Targets = slices.DeleteFunc(r.Targets, func(t target) bool { return math.IsNaN(t.Got) })
}

func (r *result) median(setup, path, metric string) float64 {
	for _, s := range r.Summary {
		if s.Setup == setup && s.Path == path && s.Metric == metric {
			return s.Median
		}
	}
	return math.NaN()
}

func (r *result) p99(setup, path, metric string) float64 {
	for _, s := range r.Summary {
		if s.Setup == setup && s.Path == path && s.Metric == metric {
			return s.P99
		}
	}
	return math.NaN()
}

// pairedTarget judges the paired ratio a/b against a target, with the
// ratio's 95% bootstrap interval.
func (r *result) pairedTarget(what, want string, ok func(float64) bool, a, pathA, b, pathB, metric string) target {
	ratios := r.pairedRatios(a, pathA, b, pathB, metric)
	med := quantile(ratios, 0.5)
	lo, hi := bootstrapMedianCI(ratios)
	return target{What: what, Want: want, Got: med, Met: ok(med), CILow: lo, CIHigh: hi, Undecided: len(ratios) > 0 && ok(lo) != ok(hi)}
}

// bootstrapMedianCI is the 95% percentile-bootstrap interval of the
// median of xs, from a fixed seed so a result recomputes the same.
func bootstrapMedianCI(xs []float64) (lo, hi float64) {
	if len(xs) == 0 {
		return math.NaN(), math.NaN()
	}
	const resamples = 2000
	r := rand.New(rand.NewPCG(1, 2))
	meds := make([]float64, resamples)
	sample := make([]float64, len(xs))
	for i := range meds {
		for j := range sample {
			sample[j] = xs[r.IntN(len(xs))]
		}
		sort.Float64s(sample)
		meds[i] = quantile(sample, 0.5)
	}
	sort.Float64s(meds)
	return quantile(meds, 0.025), quantile(meds, 0.975)
}

// pairedRatio is the median over repetitions of a/b within each repetition.
func (r *result) pairedRatio(a, pathA, b, pathB, metric string) float64 {
	return quantile(r.pairedRatios(a, pathA, b, pathB, metric), 0.5)
}

// pairedRatios are a/b within each repetition, sorted.
func (r *result) pairedRatios(a, pathA, b, pathB, metric string) []float64 {
	byRep := map[int]float64{}
	for _, s := range r.Samples {
		if s.Setup == b && s.Path == pathB && s.Metric == metric {
			byRep[s.Rep] = s.Value
		}
	}
	var ratios []float64
	for _, s := range r.Samples {
		if s.Setup == a && s.Path == pathA && s.Metric == metric {
			if d, ok := byRep[s.Rep]; ok && d > 0 {
				ratios = append(ratios, s.Value/d)
			}
		}
	}
	sort.Float64s(ratios)
	return ratios
}

// judge compares the run with its scenario's targets.
func (r *result) judge() {
	switch r.Scenario {
	case "pod-launch":
		r.judgePodLaunch()
		return
	case "policy-scale":
		r.judgePolicyScale()
		return
	case "services":
		r.judgeServices()
		return
	case "l7-gate":
		r.judgeL7Gate()
		return
	case "l7":
		r.judgeL7()
		return
	}
	r.judgeDatapath()
}

// judgePodLaunch: Weir must not make pods slower to start than the
// reference plugin, and its ADD stays within the datapath scenario's bound.
func (r *result) judgePodLaunch() {
	ready := r.median(launchWeir, "launch", "ready_ms") / r.median(launchBridge, "launch", "ready_ms")
	add := r.p99(launchWeir, "launch", "add_ms")
	addRatio := r.median(launchWeir, "launch", "add_ms") / r.median(launchBridge, "launch", "add_ms")
	r.Targets = append(r.Targets,
		target{What: "create to Ready median, weir / bridge", Want: "<= 1.00", Got: ready, Met: ready <= 1},
		target{What: "CNI ADD median, weir / bridge", Want: "<= 1.00", Got: addRatio, Met: addRatio <= 1},
		target{What: "CNI ADD p99 inside a launch (ms)", Want: "< 50", Got: add, Met: add < 50},
	)
}

// judgeDatapath compares the paired ratios with the targets.
func (r *result) judgeDatapath() {
	atLeast := func(x float64) func(float64) bool { return func(v float64) bool { return v >= x } }
	atMost := func(x float64) func(float64) bool { return func(v float64) bool { return v <= x } }
	r.Targets = append(r.Targets,
		r.pairedTarget("intra-node TCP throughput, Weir / raw veth", ">= 0.95", atLeast(0.95), setupWeir, "intra", setupRaw, "intra", "tcp_gbps"),
		r.pairedTarget("intra-node request/response latency, Weir / raw veth", "<= 1.10", atMost(1.10), setupWeir, "intra", setupRaw, "intra", "rr_avg_us"),
	)
	pairs := [][3]string{{setupWeir, setupBridge, "intra"}, {setupWeirVXLAN, setupBridgeVXLAN, "inter"}}
	for _, p := range pairs {
		for _, m := range []string{"tcp_gbps", "udp_gbps"} {
			r.Targets = append(r.Targets, r.pairedTarget(fmt.Sprintf("%s %s, %s / %s", p[2], m, p[0], p[1]), ">= 1.00", atLeast(1), p[0], p[2], p[1], p[2], m))
		}
		r.Targets = append(r.Targets, r.pairedTarget(fmt.Sprintf("%s rr latency, %s / %s", p[2], p[0], p[1]), "<= 1.00", atMost(1), p[0], p[2], p[1], p[2], "rr_avg_us"))
	}
	r.judgeFlowCost()
	add := r.p99(setupWeir, "cni", "add_ms")
	r.Targets = append(r.Targets, target{What: "CNI ADD p99 (ms)", Want: "< 50", Got: add, Met: add < 50})
	v := add / r.p99(setupBridge, "cni", "add_ms")
	r.Targets = append(r.Targets, target{What: "CNI ADD p99, weir / bridge", Want: "<= 1.00", Got: v, Met: v <= 1})
}

// judgeFlowCost: flow records (verdict events, the agent's flow store) may
// cost at most 3% on any datapath figure, measured against the same
// setup with events off. A run without the flows-off setups (an older
// one, or one limited by --setups) has no pair: those targets come out
// NaN and summarise drops them.
func (r *result) judgeFlowCost() {
	pairs := [][3]string{{setupWeir, setupWeirNoFlows, "intra"}, {setupWeirVXLAN, setupWeirVXLANNoFlows, "inter"}}
	for _, p := range pairs {
		for _, m := range []string{"tcp_gbps", "udp_gbps", "crr_per_s"} {
			r.Targets = append(r.Targets, r.pairedTarget(fmt.Sprintf("flow cost: %s %s, flows on / off", p[2], m), ">= 0.97",
				func(v float64) bool { return v >= 0.97 }, p[0], p[2], p[1], p[2], m))
		}
		r.Targets = append(r.Targets, r.pairedTarget(fmt.Sprintf("flow cost: %s rr latency, flows on / off", p[2]), "<= 1.03",
			func(v float64) bool { return v <= 1.03 }, p[0], p[2], p[1], p[2], "rr_avg_us"))
	}
}

// warmupNote describes the warm-up, if the run had one.
func (r *result) warmupNote() string {
	if r.WarmupS == 0 {
		return ""
	}
	return fmt.Sprintf(", after a %gs warm-up of every test on every setup", r.WarmupS)
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	pos := q * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}

// write stores JSON and Markdown, draws the PNG and prints the table.
func (r *result) write(dir string, out io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	base := filepath.Join(dir, r.Scenario)
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(base+".json", b, 0o644); err != nil {
		return err
	}
	md := r.markdown()
	if err := os.WriteFile(base+".md", []byte(md), 0o644); err != nil {
		return err
	}
	fmt.Fprint(out, md)
	plot := exec.Command("/usr/bin/python3", "bench/plot.py", base+".json", base+".png")
	if o, err := plot.CombinedOutput(); err != nil {
		return fmt.Errorf("draw chart: %w: %s", err, o)
	}
	fmt.Fprintf(out, "\nwrote %s.json, %s.md, %s.png\n", base, base, base)
	return nil
}

var metricTitles = []struct{ key, title string }{
	{"tcp_gbps", "TCP stream (Gbit/s)"},
	{"udp_gbps", "UDP stream, delivered (Gbit/s)"},
	{"udp_loss_pct", "UDP loss (%)"},
	{"rr_avg_us", "TCP request/response, mean (µs, half round trip)"},
	{"rr_p99_us", "TCP request/response, p99 within a run (µs)"},
	{"crr_per_s", "TCP connections per second (new connection per request)"},
}

func (r *result) markdown() string {
	switch r.Scenario {
	case "pod-launch":
		return r.podLaunchMarkdown()
	case "policy-scale":
		return r.policyScaleMarkdown()
	case "services":
		return r.servicesMarkdown()
	case "l7-gate":
		return r.l7GateMarkdown()
	case "l7":
		return r.l7Markdown()
	}
	var b strings.Builder
	r.writeHeader(&b)
	fmt.Fprintf(&b, "%d repetitions of %gs each, setups interleaved, load tools pinned (streams and connection rate: client on CPU 0, server on CPU 1; request/response: both on CPU 0)%s. Cells: median (median of the per-repetition ratios to the raw veth pair).\n", r.Reps, r.DurationS, r.warmupNote())
	b.WriteString(r.precisionLine())
	b.WriteString("Targets use the paired ratios: this machine drifts more between repetitions than the setups differ within one.\n\n")
	for _, path := range []string{"intra", "inter"} {
		setups := r.setups(path)
		if len(setups) == 0 {
			continue // a run limited by --setups
		}
		fmt.Fprintf(&b, "## %s-node\n\n| metric | %s |\n|---|%s\n", path, strings.Join(setups, " | "), strings.Repeat("---|", len(setups)))
		for _, m := range metricTitles {
			if !slices.ContainsFunc(setups, func(s string) bool { return !math.IsNaN(r.median(s, path, m.key)) }) {
				continue // a test this run did not have (--tests)
			}
			fmt.Fprintf(&b, "| %s |", m.title)
			for _, s := range setups {
				v := r.median(s, path, m.key)
				cell := fmt.Sprintf(" %.2f", v)
				if st := r.find(s, path, m.key); st != nil && st.PairedRatioToRaw > 0 && m.key != "udp_loss_pct" {
					cell += fmt.Sprintf(" (%.2f)", st.PairedRatioToRaw)
				}
				b.WriteString(cell + " |")
			}
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}
	b.WriteString("## eBPF cost per program run (ns, kernel run-time statistics)\n\n| setup | path | test | program | ns/run |\n|---|---|---|---|---|\n")
	for _, s := range r.Summary {
		if strings.HasPrefix(s.Metric, "bpf_ns_per_run/") {
			parts := strings.Split(s.Metric, "/")
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %.0f |\n", s.Setup, s.Path, parts[1], parts[2], s.Median)
		}
	}
	if math.IsNaN(r.median(setupWeir, "cni", "add_ms")) {
		b.WriteString("\nCNI latency: not measured in this run (--pods=0).\n")
		r.writeTargets(&b)
		return b.String()
	}
	b.WriteString("\n## CNI latency (ms, one sample per pod)\n\n| plugin | ADD p50 | ADD p99 | DEL p50 | DEL p99 |\n|---|---|---|---|---|\n")
	for _, s := range []string{setupWeir, setupBridge} {
		fmt.Fprintf(&b, "| %s | %.1f | %.1f | %.1f | %.1f |\n", s, r.median(s, "cni", "add_ms"), r.p99(s, "cni", "add_ms"), r.median(s, "cni", "del_ms"), r.p99(s, "cni", "del_ms"))
	}
	r.writeTargets(&b)
	return b.String()
}

// writeHeader opens every report: the scenario, the command that reruns
// it, when and on what it ran.
func (r *result) writeHeader(b *strings.Builder) {
	fmt.Fprintf(b, "# Benchmark: %s\n\n", r.Scenario)
	fmt.Fprintf(b, "Command: `%s`  \nCommit: %s  \nRun: %s to %s on %s, %s CPUs, kernel %s.  \n", r.Command, orUnrecorded(r.Commit), r.Started, r.Finished, r.Machine["cpu"], r.Machine["cpus"], r.Machine["kernel"])
	if r.Incomplete != "" {
		fmt.Fprintf(b, "**Incomplete**: the run stopped early (%s); the figures below are what it measured until then.  \n", r.Incomplete)
	}
}

func (r *result) podLaunchMarkdown() string {
	var b strings.Builder
	r.writeHeader(&b)
	fmt.Fprintf(&b, "One two-node Kubernetes %s cluster; %d pods per setup launched one at a time, the setups alternating. "+
		"Weir pods use the default runtime handler, bridge pods the `bridge` RuntimeClass (reference bridge + host-local plugins) on the same nodes. "+
		"Create to Ready is the client's view (create call to the watch showing Ready); CNI ADD is timed around the real plugin by a wrapper the runtime calls.\n\n", lab.KubernetesVersion, r.Reps)
	b.WriteString("| metric | weir p50 | weir p99 | bridge p50 | bridge p99 |\n|---|---|---|---|---|\n")
	for _, m := range []struct{ key, title string }{
		{"ready_ms", "create to Ready (ms)"}, {"add_ms", "CNI ADD (ms)"}, {"add_share_pct", "ADD share of the launch (%)"}, {"del_ms", "CNI DEL (ms), all pods deleted at once"},
	} {
		fmt.Fprintf(&b, "| %s | %.1f | %.1f | %.1f | %.1f |\n", m.title, r.median(launchWeir, "launch", m.key), r.p99(launchWeir, "launch", m.key),
			r.median(launchBridge, "launch", m.key), r.p99(launchBridge, "launch", m.key))
	}
	r.writeTargets(&b)
	return b.String()
}

// writeTargets appends the run's verdict on its scenario's targets.
func (r *result) writeTargets(b *strings.Builder) {
	b.WriteString("\n## Targets\n\nPaired ratios carry their 95% bootstrap interval over the repetitions; a target whose interval spans it is undecided by this run.\n\n")
	b.WriteString("| target | want | got | 95% interval | met |\n|---|---|---|---|---|\n")
	for _, t := range r.Targets {
		ci := ""
		if t.CILow != 0 || t.CIHigh != 0 {
			ci = fmt.Sprintf("%.3f to %.3f", t.CILow, t.CIHigh)
		}
		met := map[bool]string{true: "yes", false: "**no**"}[t.Met]
		if t.Undecided {
			met += " (undecided)"
		}
		fmt.Fprintf(b, "| %s | %s | %.3f | %s | %s |\n", t.What, t.Want, t.Got, ci, met)
	}
}

func (r *result) find(setup, path, metric string) *stat {
	for i := range r.Summary {
		s := &r.Summary[i]
		if s.Setup == setup && s.Path == path && s.Metric == metric {
			return s
		}
	}
	return nil
}

func (r *result) setups(path string) []string {
	var out []string
	seen := map[string]bool{}
	for _, s := range r.Summary {
		if s.Path == path && !seen[s.Setup] {
			seen[s.Setup] = true
			out = append(out, s.Setup)
		}
	}
	return out
}

// rerunReport rebuilds a result's summary and outputs from its samples.
func rerunReport(path string, out io.Writer) error {
	r, err := readResult(path)
	if err != nil {
		return err
	}
	r.Summary, r.Targets = nil, nil
	r.summarise()
	return r.write(filepath.Dir(path), out)
}

func orUnrecorded(s string) string {
	if s == "" {
		return "unrecorded"
	}
	return s
}

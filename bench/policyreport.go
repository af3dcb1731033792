package main

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// policyLevels are the setups of the rule-count measurement, fewest
// rules first, "no policy" leading.
func (r *result) policyLevels() []string {
	var levels []string
	seen := map[string]bool{}
	for _, s := range r.Samples {
		if s.Metric == "tcp_gbps" && s.Setup != setupRaw && !seen[s.Setup] {
			seen[s.Setup] = true
			levels = append(levels, s.Setup)
		}
	}
	sort.Slice(levels, func(i, j int) bool { return ruleCount(levels[i]) < ruleCount(levels[j]) })
	return levels
}

// ruleCount reads "1000 rules" back; "no policy" is 0.
func ruleCount(level string) int {
	n, _ := strconv.Atoi(strings.TrimSuffix(level, " rules"))
	return n
}

// clientCounts are the concurrent-client paths, fewest first.
func (r *result) clientCounts() []int {
	var out []int
	seen := map[int]bool{}
	for _, s := range r.Samples {
		if n, ok := strings.CutSuffix(s.Path, " clients"); ok {
			v, _ := strconv.Atoi(n)
			if !seen[v] {
				seen[v] = true
				out = append(out, v)
			}
		}
	}
	sort.Ints(out)
	return out
}

// pooled is a quantile over every sample of a metric, whatever the
// setup or path.
func (r *result) pooled(metric string, q float64) float64 {
	var v []float64
	for _, s := range r.Samples {
		if s.Metric == metric {
			v = append(v, s.Value)
		}
	}
	sort.Float64s(v)
	return quantile(v, q)
}

// worst is the smallest (or largest) sample of a setup, path and metric.
func (r *result) worst(setup, path, metric string, largest bool) float64 {
	w := math.NaN()
	for _, s := range r.Samples {
		if s.Setup == setup && s.Path == path && s.Metric == metric {
			if math.IsNaN(w) || (largest && s.Value > w) || (!largest && s.Value < w) {
				w = s.Value
			}
		}
	}
	return w
}

// judgePolicyScale compares the run with issue 5's targets.
func (r *result) judgePolicyScale() {
	atLeast := func(x float64) func(float64) bool { return func(v float64) bool { return v >= x } }
	atMost := func(x float64) func(float64) bool { return func(v float64) bool { return v <= x } }
	levels := r.policyLevels()
	if len(levels) > 1 {
		top := levels[len(levels)-1]
		for _, path := range []string{"intra", "inter"} {
			r.Targets = append(r.Targets, r.pairedTarget(fmt.Sprintf("%s TCP stream, %s / no policy", path, top), ">= 0.97", atLeast(0.97),
				top, path, "no policy", path, "tcp_gbps"))
		}
		r.Targets = append(r.Targets,
			r.pairedTarget(fmt.Sprintf("intra TCP stream, %s / raw veth", top), ">= 0.95", atLeast(0.95), top, "intra", setupRaw, "intra", "tcp_gbps"),
			r.pairedTarget(fmt.Sprintf("intra request/response, %s / raw veth", top), "<= 1.10", atMost(1.10), top, "intra", setupRaw, "intra", "rr_avg_us"))
	}
	// Policy that costs the same at the most rules as at the fewest: every
	// new connection is one policy lookup, whatever the rule count.
	if len(levels) > 2 {
		few, top := levels[1], levels[len(levels)-1]
		for _, path := range []string{"intra", "inter"} {
			r.Targets = append(r.Targets,
				r.pairedTarget(fmt.Sprintf("%s new connections/s, %s / %s", path, top, few), ">= 0.97", atLeast(0.97), top, path, few, path, "crr_per_s"),
				r.pairedTarget(fmt.Sprintf("%s request/response, %s / %s", path, top, few), "<= 1.03", atMost(1.03), top, path, few, path, "rr_avg_us"))
		}
	}
	if counts := r.clientCounts(); len(counts) > 0 {
		n := counts[len(counts)-1]
		v := r.worst(clientsPolicy, fmt.Sprintf("%d clients", n), "completed", false)
		r.Targets = append(r.Targets, target{What: fmt.Sprintf("clients completed of %d under one policy (worst rep)", n), Want: fmt.Sprintf("= %d", n), Got: v, Met: v == float64(n)})
	}
	for _, s := range r.Summary {
		if s.Path == "agents" && s.Metric == "agent_rss_mib" {
			r.Targets = append(r.Targets, target{What: fmt.Sprintf("largest agent RSS at %s (MiB)", s.Setup), Want: "< 100", Got: s.Max, Met: s.Max < 100})
		}
	}
	if g := r.pooled("grant_ms", 0.99); !math.IsNaN(g) {
		r.Targets = append(r.Targets,
			target{What: "policy change to enforcement (grant), p99 (ms)", Want: "< 100", Got: g, Met: g < 100},
			target{What: "revocation of a live connection, p99 (ms)", Want: "< 1000", Got: r.pooled("revoke_ms", 0.99), Met: r.pooled("revoke_ms", 0.99) < 1000})
	}
}

func (r *result) policyScaleMarkdown() string {
	var b strings.Builder
	r.writeHeader(&b)
	fmt.Fprintf(&b, "One two-node Kubernetes cluster (agents as a DaemonSet, vxlan); server pod on n1, clients on n1 (intra) and n2 (inter). "+
		"%d repetitions of %gs per test, rule counts in a rotating order within every repetition, the raw veth pair in the same repetitions. "+
		"Cells: median (median of the per-repetition ratios to no policy).\n\n", r.Reps, r.DurationS)
	b.WriteString(r.precisionLine())
	b.WriteString("\n## TCP stream, request/response and new connections by rule count\n\n")
	b.WriteString("| setup | intra TCP (Gbit/s) | inter TCP (Gbit/s) | intra req/resp (µs) | inter req/resp (µs) | intra new conn/s | inter new conn/s | intra req/resp p99 (µs) | agents' CPU during intra stream (% of a CPU) | machine CPU (%) | largest agent RSS (MiB) | applied in (s) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, level := range append(r.policyLevels(), setupRaw) {
		cell := func(path, metric string) string {
			v := r.median(level, path, metric)
			if math.IsNaN(v) {
				return "–"
			}
			if level == setupRaw || level == "no policy" {
				return fmt.Sprintf("%.2f", v)
			}
			return fmt.Sprintf("%.2f (%.3f)", v, r.pairedRatio(level, path, "no policy", path, metric))
		}
		plain := func(path, metric, format string) string {
			v := r.median(level, path, metric)
			if math.IsNaN(v) {
				return "–"
			}
			return fmt.Sprintf(format, v)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", level,
			cell("intra", "tcp_gbps"), cell("inter", "tcp_gbps"), cell("intra", "rr_avg_us"), cell("inter", "rr_avg_us"),
			cell("intra", "crr_per_s"), cell("inter", "crr_per_s"),
			plain("intra", "rr_p99_us", "%.1f"), plain("intra", "agent_cpu_pct", "%.1f"), plain("intra", "cpu_busy_pct", "%.0f"),
			plain("intra", "agent_rss_mib", "%.1f"), plain("apply", "apply_s", "%.2f"))
	}
	if counts := r.clientCounts(); len(counts) > 0 {
		b.WriteString("\n## Concurrent client pods against one server (inter-node, wrk with one connection each)\n\n")
		b.WriteString("| clients | setup | completed (worst rep) | requests/s, all clients | mean latency (ms) |\n|---|---|---|---|---|\n")
		for _, n := range counts {
			path := fmt.Sprintf("%d clients", n)
			for _, s := range []string{clientsOpen, clientsPolicy} {
				fmt.Fprintf(&b, "| %d | %s | %.0f/%d | %.0f | %.2f |\n", n, s, r.worst(s, path, "completed", false), n,
					r.median(s, path, "rps_total"), r.median(s, path, "latency_avg_ms"))
			}
		}
	}
	if !math.IsNaN(r.pooled("grant_ms", 0.5)) {
		b.WriteString("\n## Policy change to enforcement (ms, from the API write)\n\n")
		b.WriteString("| change | path | n | p50 | p99 | max |\n|---|---|---|---|---|---|\n")
		for _, m := range []struct{ key, title string }{
			{"grant_ms", "grant: first connection succeeds"},
			{"grant_api_ms", "of which API server: a watch sees the new policy"},
			{"revoke_ms", "revoke: live connection stops"},
			{"revoke_api_ms", "of which API server: a watch sees the deletion"},
			{"grant_cpu_pressure_pct", "CPU pressure during a grant (% of the time a task waited for a CPU)"},
		} {
			if math.IsNaN(r.pooled(m.key, 0.5)) {
				continue // a run from before the metric existed
			}
			for _, s := range r.Summary {
				if s.Metric == m.key {
					fmt.Fprintf(&b, "| %s | %s (%s) | %d | %.1f | %.1f | %.1f |\n", m.title, s.Path, s.Setup, s.N, s.Median, s.P99, s.Max)
				}
			}
			fmt.Fprintf(&b, "| %s | both | | %.1f | %.1f | |\n", m.title, r.pooled(m.key, 0.5), r.pooled(m.key, 0.99))
		}
	}
	r.writeTargets(&b)
	return b.String()
}

package main

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/weirnet/weir/internal/datapath"
)

// svSetup names one setup of the services run: a proxy at a Service
// count, "weir, 1000 Services".
func svSetup(proxy string, level int) string { return fmt.Sprintf("%s, %d Services", proxy, level) }

// serviceLevels are the Service counts a services run measured, fewest
// first.
func (r *result) serviceLevels() []int {
	seen := map[int]bool{}
	var out []int
	for _, s := range r.Samples {
		_, count, ok := strings.Cut(s.Setup, ", ")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSuffix(count, " Services"))
		if err == nil && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	sort.Ints(out)
	return out
}

// pooledSetup is a quantile over every sample of one setup's metric.
func (r *result) pooledSetup(setup, metric string, q float64) float64 {
	var v []float64
	for _, s := range r.Samples {
		if s.Setup == setup && s.Metric == metric {
			v = append(v, s.Value)
		}
	}
	sort.Float64s(v)
	return quantile(v, q)
}

// normalisedRatios pairs, repetition by repetition, setup a's value over
// its value on the pod IP path, divided by the same for setup b: how the
// Service path compares at two Service counts with the machine's drift
// between the two (measured minutes apart) taken out by the pod-IP path
// measured seconds from each.
func (r *result) normalisedRatios(a, b, path, metric string) []float64 {
	num := r.pairedRatios(a, path, a, path+" pod IP", metric)
	den := r.pairedRatios(b, path, b, path+" pod IP", metric)
	var out []float64
	for i := range min(len(num), len(den)) {
		out = append(out, num[i]/den[i])
	}
	sort.Float64s(out)
	return out
}

// hasSizePairs says whether the run measured size pairs between few and
// top Services.
func (r *result) hasSizePairs(few, top int) bool {
	return len(r.pairedRatios(svSetup("weir", top), sizePath("intra"), svSetup("weir", few), sizePath("intra"), "crr_per_s")) > 0
}

// judgeServices compares the run with issue 18's targets.
func (r *result) judgeServices() {
	atLeast := func(x float64) func(float64) bool { return func(v float64) bool { return v >= x } }
	atMost := func(x float64) func(float64) bool { return func(v float64) bool { return v <= x } }
	levels := r.serviceLevels()
	if len(levels) == 0 {
		return
	}
	few, top := levels[0], levels[len(levels)-1]
	if few != top {
		// The size pairs, measured seconds apart, decide the target when
		// the run has them; otherwise the levels, minutes apart, whose raw
		// ratio carries the machine's drift and whose normalised one
		// takes it out.
		at, how := func(p string) string { return p }, "levels measured minutes apart"
		if r.hasSizePairs(few, top) {
			at, how = sizePath, "size pairs, the Service count changed between halves"
		}
		for _, path := range []string{"intra", "inter"} {
			r.Targets = append(r.Targets, r.pairedTarget(
				fmt.Sprintf("%s new connections/s through a ClusterIP, weir at %d / at %d Services (%s)", path, top, few, how), ">= 0.97", atLeast(0.97),
				svSetup("weir", top), at(path), svSetup("weir", few), at(path), "crr_per_s"))
			ratios := r.normalisedRatios(svSetup("weir", top), svSetup("weir", few), at(path), "crr_per_s")
			if len(ratios) > 0 {
				lo, hi := bootstrapMedianCI(ratios)
				med := quantile(ratios, 0.5)
				r.Targets = append(r.Targets, target{
					What: fmt.Sprintf("(same, each figure divided by the pod IP's measured beside it) %s, %d / %d Services", path, top, few),
					Want: ">= 0.97", Got: med, Met: med >= 0.97, CILow: lo, CIHigh: hi, Undecided: (lo >= 0.97) != (hi >= 0.97)})
			}
		}
	}
	for _, level := range levels {
		if level < 1000 {
			continue
		}
		for _, path := range []string{"intra", "inter", "nodeport"} {
			r.Targets = append(r.Targets, r.pairedTarget(
				fmt.Sprintf("%s new connections/s at %d Services, weir / kube-proxy iptables", path, level), ">= 1.15", atLeast(1.15),
				svSetup("weir", level), path, svSetup("kube-proxy iptables", level), path, "crr_per_s"))
		}
		break // the target is at 1,000
	}
	for _, path := range []string{"intra", "inter"} {
		r.Targets = append(r.Targets, r.pairedTarget(
			fmt.Sprintf("%s request/response at %d Services, weir ClusterIP / pod IP", path, top), "<= 1.05", atMost(1.05),
			svSetup("weir", top), path, svSetup("weir", top), path+" pod IP", "rr_avg_us"))
	}
	if v := r.pooledSetup(svSetup("weir", top), "change_ms", 0.99); !math.IsNaN(v) {
		r.Targets = append(r.Targets, target{What: fmt.Sprintf("Service change to traffic at %d Services, weir, p99 (ms)", top), Want: "< 100", Got: v, Met: v < 100})
	}
	if v := r.worst(svSetup("weir", top), "cost", "agent_rss_mib", true); !math.IsNaN(v) {
		r.Targets = append(r.Targets, target{What: fmt.Sprintf("largest agent RSS at %d Services, weir (MiB)", top), Want: "< 150", Got: v, Met: v < 150})
	}
}

// servicesMarkdown is the services run's report: one table per Service
// count with the proxies side by side.
func (r *result) servicesMarkdown() string {
	var b strings.Builder
	r.writeHeader(&b)
	fmt.Fprintf(&b, "One two-node Kubernetes cluster (agents as host processes, vxlan); a server pod on n1 served by the benchmark's own HTTP and sockperf servers, "+
		"client pods on n1 (intra) and n2 (inter), the NodePort reached from the lab's outside host at n2 (the node without the backend). "+
		"At every Service count, %d repetitions with the three Service proxies in a rotating order (the lab switched between them: kube-proxy stopped and its rules removed, "+
		"the agents restarted with or without the replacement). %gs per load run; new connections: wrk, one request per connection, 4 connections; "+
		"request/response: sockperf ping-pong over one connection; DNS: one lookup at a time through CoreDNS's ClusterIP, each from a new socket. "+
		"Cells: median of the repetitions (for kube-proxy: median of the per-repetition ratios weir / kube-proxy in brackets).\n\n", r.Reps, r.DurationS)
	proxies := []string{"weir", "kube-proxy nftables", "kube-proxy iptables"}
	rows := []struct{ path, metric, title, format string }{
		{"intra", "crr_per_s", "intra new conn/s through ClusterIP", "%.0f"},
		{"intra pod IP", "crr_per_s", "intra new conn/s to the pod IP", "%.0f"},
		{"inter", "crr_per_s", "inter new conn/s through ClusterIP", "%.0f"},
		{"inter pod IP", "crr_per_s", "inter new conn/s to the pod IP", "%.0f"},
		{"intra", "conn_p50_ms", "intra whole connection via ClusterIP, one at a time, p50 (ms)", "%.3f"},
		{"intra", "conn_p99_ms", "intra whole connection via ClusterIP, one at a time, p99 (ms)", "%.3f"},
		{"inter", "conn_p50_ms", "inter whole connection via ClusterIP, one at a time, p50 (ms)", "%.3f"},
		{"inter", "conn_p99_ms", "inter whole connection via ClusterIP, one at a time, p99 (ms)", "%.3f"},
		{"intra", "rr_avg_us", "intra request/response via ClusterIP (µs)", "%.2f"},
		{"intra pod IP", "rr_avg_us", "intra request/response to the pod IP (µs)", "%.2f"},
		{"inter", "rr_avg_us", "inter request/response via ClusterIP (µs)", "%.2f"},
		{"inter pod IP", "rr_avg_us", "inter request/response to the pod IP (µs)", "%.2f"},
		{"nodeport", "crr_per_s", "NodePort from outside, new conn/s", "%.0f"},
		{"nodeport", "conn_p50_ms", "NodePort from outside, whole connection p50 (ms)", "%.3f"},
		{"nodeport", "conn_p99_ms", "NodePort from outside, whole connection p99 (ms)", "%.3f"},
		{"intra", "crr_errors", "intra wrk socket errors via ClusterIP (per repetition)", "%.0f"},
		{"nodeport", "crr_errors", "NodePort wrk socket errors (per repetition)", "%.0f"},
		{"intra", "conn_failed", "intra whole connections not done within 5 s (per repetition)", "%.0f"},
		{"inter", "conn_failed", "inter whole connections not done within 5 s (per repetition)", "%.0f"},
		{"nodeport", "conn_failed", "NodePort whole connections not done within 5 s (per repetition)", "%.0f"},
		{"dns", "dns_failed", "DNS lookups unanswered within 1 s (per repetition)", "%.0f"},
		{"dns", "dns_p50_ms", "DNS lookup p50 (ms)", "%.3f"},
		{"dns", "dns_p99_ms", "DNS lookup p99 (ms)", "%.3f"},
		{"cost", "agent_cpu_pct", "agents' CPU over the repetition (% of a CPU)", "%.1f"},
		{"cost", "agent_rss_mib", "largest agent RSS (MiB)", "%.1f"},
		{"cost", "kube_proxy_cpu_pct", "kube-proxies' CPU over the repetition (% of a CPU)", "%.1f"},
		{"cost", "kube_proxy_rss_mib", "largest kube-proxy RSS (MiB)", "%.1f"},
	}
	for _, level := range r.serviceLevels() {
		fmt.Fprintf(&b, "## %d Services\n\n| metric | %s |\n|---|%s\n", level, strings.Join(proxies, " | "), strings.Repeat("---|", len(proxies)))
		for _, row := range rows {
			fmt.Fprintf(&b, "| %s |", row.title)
			for _, p := range proxies {
				v := r.median(svSetup(p, level), row.path, row.metric)
				if math.IsNaN(v) {
					b.WriteString(" – |")
					continue
				}
				cell := fmt.Sprintf(" "+row.format, v)
				counted := strings.HasSuffix(row.metric, "_errors") || strings.HasSuffix(row.metric, "_failed")
				if p != "weir" && row.path != "cost" && !counted {
					if ratio := r.pairedRatio(svSetup("weir", level), row.path, svSetup(p, level), row.path, row.metric); !math.IsNaN(ratio) {
						cell += fmt.Sprintf(" (%.2f)", ratio)
					}
				}
				b.WriteString(cell + " |")
			}
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "| Service change to traffic p50 / p99 (ms) |")
		for _, p := range proxies {
			s := svSetup(p, level)
			fmt.Fprintf(&b, " %.1f / %.1f |", r.pooledSetup(s, "change_ms", 0.5), r.pooledSetup(s, "change_ms", 0.99))
		}
		b.WriteString("\n\n")
	}
	r.writeSizePairs(&b)
	r.writeTargets(&b)
	return b.String()
}

// writeSizePairs is the size pairs' table: Weir alone at the fewest and
// the most Services, each ratio paired within a pair, with the eBPF
// programs' time per run, where a connection's cost would have to grow.
func (r *result) writeSizePairs(b *strings.Builder) {
	levels := r.serviceLevels()
	if len(levels) < 2 || !r.hasSizePairs(levels[0], levels[len(levels)-1]) {
		return
	}
	few, top := svSetup("weir", levels[0]), svSetup("weir", levels[len(levels)-1])
	fmt.Fprintf(b, "## Size pairs: weir alone at %d and %d Services in turn\n\n"+
		"The Service count changed between the halves of each pair (bulk Services deleted or created, every agent's maps checked to hold them), "+
		"the halves in alternating order, %d load runs per path in each half; the BPF run-time statistics on for these runs only. "+
		"Ratio: median of the paired ratios, with its 95%% interval.\n\n"+
		"| metric | %d Services | %d Services | ratio |\n|---|---|---|---|\n", levels[0], levels[len(levels)-1], svSizeRounds, levels[0], levels[len(levels)-1])
	row := func(title, path, metric, format string) {
		lo, hi := bootstrapMedianCI(r.pairedRatios(top, path, few, path, metric))
		fmt.Fprintf(b, "| %s | "+format+" | "+format+" | %.3f (%.3f to %.3f) |\n", title,
			r.median(few, path, metric), r.median(top, path, metric), r.pairedRatio(top, path, few, path, metric), lo, hi)
	}
	for _, path := range []string{"intra", "inter"} {
		row(path+" new conn/s through ClusterIP", sizePath(path), "crr_per_s", "%.0f")
		row(path+" new conn/s to the pod IP", sizePath(path+" pod IP"), "crr_per_s", "%.0f")
	}
	if !math.IsNaN(r.median(few, sizePath("intra"), "agent_cpu_pct")) {
		for _, path := range []string{"intra", "inter"} {
			row(path+" via ClusterIP: agents' CPU during the run (% of a CPU)", sizePath(path), "agent_cpu_pct", "%.1f")
			row(path+" to the pod IP: agents' CPU during the run (% of a CPU)", sizePath(path+" pod IP"), "agent_cpu_pct", "%.1f")
		}
		row("wait for a quiet machine before a half (s)", sizePath("quiet"), "wait_s", "%.0f")
		row("machine busy when the half started (%)", sizePath("quiet"), "machine_busy_pct", "%.1f")
	}
	for _, path := range []string{"intra", "inter"} {
		for _, name := range append(append([]string{}, datapath.SocketProgramNames...), datapath.ProgramNames...) {
			if math.IsNaN(r.median(few, sizePath(path), "bpf_ns_per_run/"+name)) {
				continue
			}
			row(fmt.Sprintf("%s via ClusterIP: %s, ns per run", path, name), sizePath(path), "bpf_ns_per_run/"+name, "%.0f")
		}
	}
	b.WriteString("\n")
}

package main

import (
	"fmt"
	"math"
	"strings"
)

// l7ConfigNames are the configurations in report order.
func l7ConfigNames() []string {
	var names []string
	for _, c := range l7Configs {
		names = append(names, c.name)
	}
	return names
}

// judgeL7 holds the run to issue 20's targets: requests/s with 1 and 40
// L7 rules as shares of no policy, p99 at the constant rate, Weir's L7
// rules against the proxy peer's same rules, and no call answered with
// anything but a 200 (the load sends only requests the rules allow).
func (r *result) judgeL7() {
	for _, t := range []struct {
		setup, base string
		want        float64
	}{{l7One, l7NoPolicy, l7WantOneRule}, {l7Forty, l7NoPolicy, l7WantFortyRules}, {l7One, l7PeerOne, l7WantPeer}, {l7Forty, l7PeerForty, l7WantPeer},
		{l7HeaderRegex, l7NoPolicy, l7WantOneRule}, {l7Tiers, l7NoPolicy, l7WantOneRule}, {l7HeaderRegex, l7PeerOne, l7WantPeer}, {l7Tiers, l7PeerOne, l7WantPeer}} {
		if math.IsNaN(r.median(t.setup, l7MaxPath, "rps")) {
			continue // a result from before the configuration existed
		}
		r.Targets = append(r.Targets, r.pairedTarget(
			fmt.Sprintf("lab: requests/s at %d keep-alive connections, %s / %s", l7GateConns, t.setup, t.base),
			fmt.Sprintf(">= %.2f", t.want), func(v float64) bool { return v >= t.want },
			t.setup, l7MaxPath, t.base, l7MaxPath, "rps"))
	}
	for _, s := range []string{l7One, l7Forty, l7HeaderRegex, l7Tiers} {
		if math.IsNaN(r.median(s, l7RatePath, "p99_ms")) {
			continue
		}
		r.Targets = append(r.Targets, r.pairedTarget(
			fmt.Sprintf("lab: p99 latency at half no policy's requests/s, %s / %s", s, l7NoPolicy),
			fmt.Sprintf("<= %.2f", l7WantRateP99), func(v float64) bool { return v <= l7WantRateP99 },
			s, l7RatePath, l7NoPolicy, l7RatePath, "p99_ms"))
	}
	for _, s := range l7ConfigNames() {
		if math.IsNaN(r.median(s, l7MaxPath, "rps")) {
			continue
		}
		total := 0.0
		for _, smp := range r.Samples {
			if smp.Setup == s && smp.Metric == "errors" {
				total += smp.Value
			}
		}
		r.Targets = append(r.Targets, target{What: fmt.Sprintf("lab: calls without a 200, %s (all runs)", s), Want: "0", Got: total, Met: total == 0})
	}
}

// l7Markdown is the report: the most requests/s at 100 connections and
// the constant-rate latency spectrum of every configuration, with the
// paired ratios to no policy, then the targets.
func (r *result) l7Markdown() string {
	var b strings.Builder
	r.writeHeader(&b)
	fmt.Fprintf(&b, "A two-node Kubernetes lab (agents as a DaemonSet, VXLAN). On n1: the server Deployment (one replica; nginx, one worker, CPU 1, a fixed 3-byte body, "+
		"in the pod's network namespace), the client pod (wrk, one thread, %d keep-alive connections, CPU 0; and fortio's periodic runner for the constant rate), "+
		"a pod no rule names, and the proxy pod. Configurations, applied through the API server in turn and each checked in place before and after its runs "+
		"(GET / served, POST / denied or served, the other pod and port reachable or not): no policy; an L3 rule (NetworkPolicy: the client pods may connect); "+
		"an L4 rule (and only to port %d); one L7 rule and 40 (WeirNetworkPolicy on port %d: GET / allowed by the set's last rule, the others differing in method, path or host; "+
		"judged in the kernel); one L7 rule the kernel leaves to user space (a Host header's regular expression: each connection handed to the agent's proxy at its first request) "+
		"and a WeirClusterNetworkPolicy's Admin Accept of GET / with an HTTP rule before a Deny of the rest (judged by the agent's proxy in the precedence order); and the peer: nginx as a proxy pod on the server's node (one worker, CPU 1 with the server, as a per-node proxy shares its node's CPUs), "+
		"in the client's path, enforcing the same 1 and 40 rules (a map of regular expressions over method, host and path, 403 for the rest) and forwarding over keep-alive upstream connections, "+
		"no Weir policy in place. %d repetitions of %gs, the configurations in a rotating order%s; the constant rate is half no policy's most requests/s in the same repetition. "+
		"Cells: median (median of the per-repetition ratios to no policy).\n\n", l7GateConns, l7Port, l7Port, r.Reps, r.DurationS, r.warmupNote())
	r.writeL7Table(&b, "## Most requests/s at 100 connections", l7MaxPath, []metricTitle{
		{"rps", "requests/s", "%.0f"}, {"p50_ms", "latency p50 (ms)", "%.3f"}, {"p99_ms", "latency p99 (ms)", "%.3f"}, {"errors", "calls without a 200 (per run)", "%.0f"},
		{"requests_judged", "requests read and allowed by the server node's kernel (per run)", "%.0f"},
		{"connections_handed", "connections handed to the agent's proxy (per run)", "%.0f"}})
	r.writeL7Table(&b, "## At a constant rate", l7RatePath, []metricTitle{
		{"rate_asked", "rate asked (req/s)", "%.0f"}, {"rate_got", "rate got (req/s)", "%.0f"}, {"p50_ms", "latency p50 (ms)", "%.3f"}, {"p90_ms", "latency p90 (ms)", "%.3f"},
		{"p99_ms", "latency p99 (ms)", "%.3f"}, {"p999_ms", "latency p99.9 (ms)", "%.3f"}, {"errors", "calls without a 200 (per run)", "%.0f"},
		{"requests_judged", "requests read and allowed by the server node's kernel (per run)", "%.0f"},
		{"connections_handed", "connections handed to the agent's proxy (per run)", "%.0f"}})
	r.writeL7Cost(&b)
	r.writeTargets(&b)
	return b.String()
}

// writeL7Cost is the eBPF cost table: each program's run time and runs
// per request served, from the run with the kernel's statistics on.
func (r *result) writeL7Cost(b *strings.Builder) {
	var setups []string
	for _, s := range l7ConfigNames() {
		if !math.IsNaN(r.median(s, l7CostPath, "ns_per_request/"+l7Programs[0])) {
			setups = append(setups, s)
		}
	}
	if len(setups) == 0 {
		return
	}
	fmt.Fprintf(b, "## eBPF run time per request\n\nOne more run of each configuration at wrk's most with the kernel's per-program statistics on "+
		"(kernel.bpf_stats_enabled, summed over both nodes' programs), after the repetitions. "+
		"Cells: ns of the program's run time per request served (its runs per request). "+
		"The sockmap's own work around the programs (queueing an skb to the socket, the send path's copy) is not in it.\n\n")
	fmt.Fprintf(b, "| program | %s |\n|---|%s\n", strings.Join(setups, " | "), strings.Repeat("---|", len(setups)))
	for _, prog := range l7Programs {
		fmt.Fprintf(b, "| %s |", prog)
		for _, s := range setups {
			fmt.Fprintf(b, " %.0f (%.2f) |", r.median(s, l7CostPath, "ns_per_request/"+prog), r.median(s, l7CostPath, "runs_per_request/"+prog))
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

type metricTitle struct{ key, title, format string }

func (r *result) writeL7Table(b *strings.Builder, title, path string, metrics []metricTitle) {
	var setups []string
	for _, s := range l7ConfigNames() {
		if !math.IsNaN(r.median(s, path, metrics[0].key)) {
			setups = append(setups, s)
		}
	}
	if len(setups) == 0 {
		return
	}
	fmt.Fprintf(b, "%s\n\n| metric | %s |\n|---|%s\n", title, strings.Join(setups, " | "), strings.Repeat("---|", len(setups)))
	for _, m := range metrics {
		fmt.Fprintf(b, "| %s |", m.title)
		for _, s := range setups {
			v := r.median(s, path, m.key)
			if math.IsNaN(v) {
				b.WriteString(" - |") // not this configuration's path
				continue
			}
			cell := fmt.Sprintf(" "+m.format, v)
			if s != l7NoPolicy && (m.key == "rps" || strings.HasSuffix(m.key, "_ms")) {
				cell += fmt.Sprintf(" (%.3f)", r.pairedRatio(s, path, l7NoPolicy, path, m.key))
			}
			b.WriteString(cell + " |")
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

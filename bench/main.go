// Command bench runs Weir's benchmark scenarios against their baselines in
// the same run, interleaved and repeated, and writes JSON, a Markdown table
// and a PNG chart to bench/results. Run it as root from the repository root:
//
//	go run ./bench datapath
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// options are shared by every scenario.
type options struct {
	reps     int
	duration time.Duration
	// Repeat until tight: up to maxReps repetitions, until every paired
	// ratio's interval is within ±precision (precision.go).
	maxReps   int
	precision float64
	warmup    time.Duration
	pods      int
	out       string
	binDir    string
	// policy-scale
	levels         []int
	clients        []int
	clientDuration time.Duration
	totalPods      int
	// datapath: run only these tests and setups (empty: all)
	tests   []string
	setups  []string
	samples int
	keep    bool
	// services: pairs of runs at the fewest and most Services
	sizePairs int
}

func newRoot() *cobra.Command {
	// One options value per scenario: flags of the same name but other
	// defaults (--reps, --pods) must not overwrite each other's.
	var dpo, plo, pso, svo, l7o, lbo options
	root := &cobra.Command{Use: "bench", Short: "Weir benchmarks", SilenceUsage: true}
	dp := scenario(&dpo, "datapath",
		"TCP stream, TCP request/response and UDP, intra- and inter-node: Weir vs raw veth vs bridge+host-local (+VXLAN); eBPF ns/packet; CNI ADD latency",
		runDatapath)
	dp.Flags().IntVar(&dpo.reps, "reps", 5, "repetitions of every measurement (interleaved); the minimum when --max-reps is larger")
	repeatFlags(dp, &dpo, 5)
	dp.Flags().DurationVar(&dpo.warmup, "warmup", 0, "a discarded run of this length of every test on every setup before the first repetition (0: none)")
	dp.Flags().DurationVar(&dpo.duration, "duration", 4*time.Second, "length of one throughput or latency run")
	dp.Flags().IntVar(&dpo.pods, "pods", 200, "pods created for the CNI ADD latency measurement")
	dp.Flags().StringVar(&dpo.out, "out", "bench/results", "directory for datapath.{json,md,png}")
	dp.Flags().StringVar(&dpo.binDir, "bin-dir", "bin", "directory holding weir-agent and weir-cni")
	dp.Flags().StringSliceVar(&dpo.tests, "tests", nil, "only these tests (tcp_stream, tcp_rr, udp_stream, tcp_crr); default all")
	dp.Flags().StringSliceVar(&dpo.setups, "setups", nil, `only these setups by name (e.g. "weir vxlan,weir vxlan (flows off)"); default all`)
	rep := &cobra.Command{
		Use:   "report FILE.json",
		Short: "Recompute the summary, table and chart of a finished run from its samples",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return rerunReport(args[0], os.Stdout)
		},
	}
	cmp := &cobra.Command{
		Use:   "compare A.json B.json",
		Short: "Check that two runs of one command agree: each paired ratio's median inside the other run's 95% interval",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, b, rows, err := compareRuns(args[0], args[1])
			if err != nil {
				return err
			}
			if n := writeComparison(os.Stdout, args[0], args[1], a, b, rows); n > 0 {
				return fmt.Errorf("%d paired ratios disagree between the runs", n)
			}
			return nil
		},
	}
	pl := scenario(&plo, "pod-launch",
		"Time from pod create to Ready and the CNI ADD inside it, Weir vs the bridge plugin on one Kubernetes cluster",
		runPodLaunch)
	pl.Flags().IntVar(&plo.pods, "pods", 30, "pods launched per setup")
	pl.Flags().StringVar(&plo.out, "out", "bench/results", "directory for pod-launch.{json,md,png}")
	pl.Flags().StringVar(&plo.binDir, "bin-dir", "bin", "directory holding weir, weir-agent, weir-cni and weir-pause (built with CGO_ENABLED=0)")
	ps := scenario(&pso, "policy-scale",
		"TCP stream and request/response at 0 to 10,000 NetworkPolicy rules, 50-200 concurrent client pods, agent CPU and memory, policy change to enforcement at 1,000 pods",
		runPolicyScale)
	ps.Flags().IntVar(&pso.reps, "reps", 3, "repetitions of every measurement (interleaved); the minimum when --max-reps is larger")
	repeatFlags(ps, &pso, 3)
	ps.Flags().DurationVar(&pso.duration, "duration", 4*time.Second, "length of one throughput or latency run")
	ps.Flags().IntSliceVar(&pso.levels, "rules", []int{100, 1000, 10000}, "rule counts measured besides no policy")
	ps.Flags().IntSliceVar(&pso.clients, "clients", []int{50, 100, 200}, "concurrent client pods")
	ps.Flags().DurationVar(&pso.clientDuration, "client-duration", 10*time.Second, "length of one concurrent-clients run")
	ps.Flags().IntVar(&pso.totalPods, "total-pods", 1000, "pods in the cluster when policy changes are timed")
	ps.Flags().IntVar(&pso.samples, "samples", 200, "policy changes timed (grant and revoke each), alternating intra- and inter-node; enough that p99 is not the single worst")
	ps.Flags().StringVar(&pso.out, "out", "bench/results", "directory for policy-scale.{json,md,png}")
	ps.Flags().BoolVar(&pso.keep, "keep", false, "leave the Kubernetes lab up afterwards, for inspection")
	ps.Flags().StringVar(&pso.binDir, "bin-dir", "bin", "directory holding the weir binaries (built with CGO_ENABLED=0)")
	sv := scenario(&svo, "services",
		"Services without kube-proxy: Weir's replacement vs kube-proxy nftables and iptables on one cluster at 4 to 5,000 Services: new connections through a ClusterIP (intra, inter), request/response, NodePort from outside, DNS, change to traffic, agent and kube-proxy CPU and memory",
		runServices)
	sv.Flags().IntVar(&svo.reps, "reps", 3, "repetitions at every Service count, the proxies in a rotating order within each (0: only the size pairs)")
	sv.Flags().DurationVar(&svo.duration, "duration", 3*time.Second, "length of one connection-rate, request/response or DNS run")
	sv.Flags().IntSliceVar(&svo.levels, "services", []int{4, 100, 1000, 5000}, "Service counts in the cluster, increasing (each bulk Service has an EndpointSlice of 2 endpoints)")
	sv.Flags().IntVar(&svo.sizePairs, "size-pairs", 4, "pairs of runs of Weir alone at the fewest and the most Service counts, the count changed between the halves (0: none)")
	sv.Flags().IntVar(&svo.samples, "changes", 5, "Service changes timed per repetition and proxy (a new Service until its ClusterIP answers)")
	sv.Flags().StringVar(&svo.out, "out", "bench/results", "directory for services.{json,md,png}")
	sv.Flags().BoolVar(&svo.keep, "keep", false, "leave the Kubernetes lab up afterwards, for inspection")
	sv.Flags().StringVar(&svo.binDir, "bin-dir", "bin", "directory holding the weir binaries (built with CGO_ENABLED=0)")
	l7 := scenario(&l7o, "l7-gate",
		"Issue 20's design gate: keep-alive requests/s and latency at 100 connections to nginx on a plain port vs ports whose sockets take bpf/l7.c's strparser and skb-verdict paths with pass-everything verdicts",
		runL7Gate)
	l7.Flags().IntVar(&l7o.reps, "reps", 7, "repetitions, the setups in a rotating order within each")
	l7.Flags().DurationVar(&l7o.duration, "duration", 5*time.Second, "length of one wrk run")
	l7.Flags().DurationVar(&l7o.warmup, "warmup", 2*time.Second, "a discarded run of each setup before the first repetition (0: none)")
	l7.Flags().StringVar(&l7o.out, "out", "bench/results", "directory for l7-gate.{json,md,png}")
	lb := scenario(&lbo, "l7",
		"Issue 20's benchmark on the lab: requests/s at 100 connections and latency at a constant rate to a server Deployment with no policy, an L3 rule, an L4 rule, 1 and 40 L7 rules, against nginx as a per-node proxy enforcing the same rules",
		runL7)
	lb.Flags().IntVar(&lbo.reps, "reps", 5, "repetitions, the configurations in a rotating order within each")
	lb.Flags().DurationVar(&lbo.duration, "duration", 5*time.Second, "length of one wrk or constant-rate run")
	lb.Flags().DurationVar(&lbo.warmup, "warmup", 2*time.Second, "a discarded run of each configuration before the first repetition (0: none)")
	lb.Flags().StringVar(&lbo.out, "out", "bench/results", "directory for l7.{json,md,png}")
	lb.Flags().BoolVar(&lbo.keep, "keep", false, "leave the Kubernetes lab up afterwards, for inspection")
	lb.Flags().StringVar(&lbo.binDir, "bin-dir", "bin", "directory holding the weir binaries (built with CGO_ENABLED=0)")
	root.AddCommand(dp, pl, ps, sv, l7, lb, rep, cmp, newHTTPServerCommand(), newDNSClientCommand(), newConnClientCommand(), newHTTPRateClientCommand())
	return root
}

// repeatFlags are the flags that make a scenario repeat until its paired
// ratios hold (precision.go). maxReps equal to --reps's default keeps the
// fixed count unless asked.
func repeatFlags(cmd *cobra.Command, o *options, maxReps int) {
	cmd.Flags().IntVar(&o.maxReps, "max-reps", maxReps, "repeat beyond --reps, up to this many repetitions, until every paired ratio's 95% interval is within --precision")
	cmd.Flags().Float64Var(&o.precision, "precision", 0.03, "wanted half-width of the paired ratios' 95% intervals, relative to their median")
}

// scenario is the command of one benchmark scenario; run gets the options
// as the flags left them.
func scenario(o *options, use, short string, run func(context.Context, options, io.Writer) error) *cobra.Command {
	return &cobra.Command{
		Use: use, Short: short, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			invocation = commandLine(cmd)
			return run(cmd.Context(), *o, os.Stdout)
		},
	}
}

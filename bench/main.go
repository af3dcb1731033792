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
	pods     int
	out      string
	binDir   string
	// policy-scale
	levels         []int
	clients        []int
	clientDuration time.Duration
	totalPods      int
	samples        int
	keep           bool
}

func newRoot() *cobra.Command {
	o := options{}
	root := &cobra.Command{Use: "bench", Short: "Weir benchmarks", SilenceUsage: true}
	dp := scenario(&o, "datapath",
		"TCP stream, TCP request/response and UDP, intra- and inter-node: Weir vs raw veth vs bridge+host-local (+VXLAN); eBPF ns/packet; CNI ADD latency",
		runDatapath)
	dp.Flags().IntVar(&o.reps, "reps", 5, "repetitions of every measurement (interleaved)")
	dp.Flags().DurationVar(&o.duration, "duration", 4*time.Second, "length of one throughput or latency run")
	dp.Flags().IntVar(&o.pods, "pods", 200, "pods created for the CNI ADD latency measurement")
	dp.Flags().StringVar(&o.out, "out", "bench/results", "directory for datapath.{json,md,png}")
	dp.Flags().StringVar(&o.binDir, "bin-dir", "bin", "directory holding weir-agent and weir-cni")
	rep := &cobra.Command{
		Use:   "report FILE.json",
		Short: "Recompute the summary, table and chart of a finished run from its samples",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return rerunReport(args[0], os.Stdout)
		},
	}
	pl := scenario(&o, "pod-launch",
		"Time from pod create to Ready and the CNI ADD inside it, Weir vs the bridge plugin on one Kubernetes cluster",
		runPodLaunch)
	pl.Flags().IntVar(&o.pods, "pods", 30, "pods launched per setup")
	pl.Flags().StringVar(&o.out, "out", "bench/results", "directory for pod-launch.{json,md,png}")
	pl.Flags().StringVar(&o.binDir, "bin-dir", "bin", "directory holding weir, weir-agent, weir-cni and weir-pause (built with CGO_ENABLED=0)")
	ps := scenario(&o, "policy-scale",
		"TCP stream and request/response at 0 to 10,000 NetworkPolicy rules, 50-200 concurrent client pods, agent CPU and memory, policy change to enforcement at 1,000 pods",
		runPolicyScale)
	ps.Flags().IntVar(&o.reps, "reps", 3, "repetitions of every measurement (interleaved)")
	ps.Flags().DurationVar(&o.duration, "duration", 4*time.Second, "length of one throughput or latency run")
	ps.Flags().IntSliceVar(&o.levels, "rules", []int{100, 1000, 10000}, "rule counts measured besides no policy")
	ps.Flags().IntSliceVar(&o.clients, "clients", []int{50, 100, 200}, "concurrent client pods")
	ps.Flags().DurationVar(&o.clientDuration, "client-duration", 10*time.Second, "length of one concurrent-clients run")
	ps.Flags().IntVar(&o.totalPods, "total-pods", 1000, "pods in the cluster when policy changes are timed")
	ps.Flags().IntVar(&o.samples, "samples", 200, "policy changes timed (grant and revoke each), alternating intra- and inter-node; enough that p99 is not the single worst")
	ps.Flags().StringVar(&o.out, "out", "bench/results", "directory for policy-scale.{json,md,png}")
	ps.Flags().BoolVar(&o.keep, "keep", false, "leave the Kubernetes lab up afterwards, for inspection")
	ps.Flags().StringVar(&o.binDir, "bin-dir", "bin", "directory holding the weir binaries (built with CGO_ENABLED=0)")
	root.AddCommand(dp, pl, ps, rep)
	return root
}

// scenario is the command of one benchmark scenario; run gets the options
// as the flags left them.
func scenario(o *options, use, short string, run func(context.Context, options, io.Writer) error) *cobra.Command {
	return &cobra.Command{
		Use: use, Short: short, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return run(cmd.Context(), *o, os.Stdout)
		},
	}
}

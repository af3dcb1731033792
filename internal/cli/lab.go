package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/lab"
)

// NewLabCommand is `weir lab`.
func NewLabCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "Multi-node Weir clusters on this machine, built from network namespaces",
	}
	cmd.AddCommand(newLabUpCommand(), newLabDownCommand(), newLabCheckCommand(), newLabStatusCommand(), newLabBuildCommand())
	return cmd
}

type labUpFlags struct {
	name   string
	nodes  int
	pods   int
	mode   string
	binDir string
	cni    string
	check  bool
}

func newLabUpCommand() *cobra.Command {
	f := labUpFlags{}
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Create the lab: underlay, nodes with their agents, pods attached through libcni",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runLabUp(cmd.Context(), f, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&f.name, "name", lab.DefaultName, "lab name (prefix of its namespaces)")
	cmd.Flags().IntVar(&f.nodes, "nodes", 2, "number of nodes")
	cmd.Flags().IntVar(&f.pods, "pods", 2, "pods per node")
	cmd.Flags().StringVar(&f.mode, "mode", string(datapath.ModeVXLAN), "inter-node datapath: vxlan or native")
	cmd.Flags().StringVar(&f.binDir, "bin-dir", defaultBinDir(), "directory holding weir-agent and weir-cni")
	cmd.Flags().StringVar(&f.cni, "cni", lab.CNIWeir, "plugin to attach pods with: weir, or bridge (the reference baseline)")
	cmd.Flags().BoolVar(&f.check, "check", false, "run the connectivity check once the lab is up")
	return cmd
}

func runLabUp(ctx context.Context, f labUpFlags, out io.Writer) error {
	mode, err := datapath.ParseMode(f.mode)
	if err != nil {
		return fmt.Errorf("--mode: %w", err)
	}
	st, err := lab.Up(ctx, lab.Config{Name: f.name, Nodes: f.nodes, PodsPerNode: f.pods, Mode: mode, BinDir: f.binDir, CNI: f.cni}, out)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "lab %s is up; `weir lab check` probes it, `weir lab down` removes it\n", st.Config.Name)
	if !f.check {
		return nil
	}
	return runLabCheck(ctx, f.name, 2*time.Second, out)
}

func newLabDownCommand() *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Remove the lab and everything it made",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return lab.Down(cmd.Context(), name, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&name, "name", lab.DefaultName, "lab name")
	return cmd
}

func newLabCheckCommand() *cobra.Command {
	var (
		name    string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Probe TCP, UDP and ICMP between every pod, node and the outside host; fail on any wrong cell",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runLabCheck(cmd.Context(), name, timeout, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&name, "name", lab.DefaultName, "lab name")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Second, "how long one probe waits for its answer")
	return cmd
}

func runLabCheck(ctx context.Context, name string, timeout time.Duration, out io.Writer) error {
	st, err := lab.Load(name)
	if err != nil {
		return err
	}
	m, err := lab.Check(ctx, st, timeout)
	if err != nil {
		return err
	}
	m.Print(out)
	return m.Err()
}

func newLabStatusCommand() *cobra.Command {
	var (
		name   string
		output string
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the lab's nodes, agents and pods",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := lab.Load(name)
			if err != nil {
				return err
			}
			return printLabStatus(cmd.Context(), st, output, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&name, "name", lab.DefaultName, "lab name")
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: json, or empty for a table")
	return cmd
}

func printLabStatus(ctx context.Context, st *lab.State, output string, out io.Writer) error {
	if output == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	fmt.Fprintf(out, "lab %s (%s mode), outside host %v\n", st.Config.Name, st.Config.Mode, st.ExtIP)
	for _, n := range st.Nodes {
		state := "ready"
		s, err := n.Client().Status(ctx)
		if err != nil {
			state = "agent down"
		}
		fmt.Fprintf(out, "node %-4s %-12v pods %-14v agent pid %-7d %s", n.Name, n.IP, n.PodCIDR, n.AgentPID, state)
		if s != nil {
			fmt.Fprintf(out, ", %d endpoints, mtu %d", len(s.Endpoints), s.MTU)
		}
		fmt.Fprintln(out)
	}
	for _, p := range st.Pods {
		fmt.Fprintf(out, "pod  %-8s on %-4s %v\n", p.Name, p.Node, p.IP)
	}
	return nil
}

func newLabBuildCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "build",
		Short: "Build (once, then from ~/.cache/weir) etcd, containerd and the Kubernetes binaries a cluster lab runs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dirs, err := lab.ClusterBinaries(cmd.Context(), cmd.OutOrStdout())
			if err != nil {
				return err
			}
			for _, name := range []string{"etcd", "containerd", "kubernetes"} {
				fmt.Fprintf(cmd.OutOrStdout(), "%-11s %s\n", name, dirs[name])
			}
			return nil
		},
	}
}

package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/lab"
)

// NewLabCommand is `weir lab`.
func NewLabCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "Multi-node Weir clusters on this machine, built from network namespaces",
	}
	cmd.AddCommand(newLabUpCommand(), newLabDownCommand(), newLabCheckCommand(), newLabStatusCommand(), newLabBuildCommand(),
		newLabAPIProxyCommand(), newLabKubectlCommand(), newLabConformanceCommand(), newLabUpgradeCommand())
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
	bare   bool
	demo   bool
	agent  string
	proxy  string
	rel    string
}

func newLabUpCommand() *cobra.Command {
	f := labUpFlags{}
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Create the lab: a Kubernetes cluster on network namespaces with Weir as its CNI (--bare: agents and libcni pods only)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runLabUp(cmd.Context(), f, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&f.name, "name", defaultLabName(), "lab name, the prefix of its namespaces (default: $WEIR_LAB if set)")
	cmd.Flags().IntVar(&f.nodes, "nodes", 2, "number of nodes")
	cmd.Flags().IntVar(&f.pods, "pods", 2, "pods per node attached through libcni (--bare only)")
	cmd.Flags().StringVar(&f.agent, "agent-mode", lab.AgentDaemonSet, "how the cluster runs weir-agent: daemonset (as users deploy it) or host (a process per node, for development)")
	cmd.Flags().StringVar(&f.proxy, "kube-proxy", lab.KubeProxyNone, "the cluster's Service proxy: none (Weir's agents replace kube-proxy), or kube-proxy in nftables or iptables mode")
	cmd.Flags().BoolVar(&f.demo, "demo", false, "deploy the demo app and show its pods talking within and across nodes and through a Service")
	cmd.Flags().BoolVar(&f.bare, "bare", false, "no Kubernetes: node agents with static peers, pods made through libcni")
	cmd.Flags().StringVar(&f.mode, "mode", string(datapath.ModeVXLAN), "inter-node datapath: vxlan or native")
	cmd.Flags().StringVar(&f.binDir, "bin-dir", defaultBinDir(), "directory holding weir-agent and weir-cni")
	cmd.Flags().StringVar(&f.cni, "cni", lab.CNIWeir, "plugin to attach pods with: weir, bridge (the reference baseline, --bare only), or none (a cluster waiting for `helm install`, see README's \"Install on your cluster\")")
	cmd.Flags().BoolVar(&f.check, "check", false, "run the connectivity check once the lab is up")
	cmd.Flags().StringVar(&f.rel, "release", "", "install the chart and agent image of this earlier commit instead of the tree's (`weir lab upgrade` then upgrades to the tree's)")
	return cmd
}

func runLabUp(ctx context.Context, f labUpFlags, out io.Writer) error {
	mode, err := datapath.ParseMode(f.mode)
	if err != nil {
		return fmt.Errorf("--mode: %w", err)
	}
	cfg := lab.Config{Name: f.name, Nodes: f.nodes, PodsPerNode: f.pods, Mode: mode, BinDir: f.binDir, CNI: f.cni, Kubernetes: !f.bare, AgentMode: f.agent, KubeProxy: f.proxy, Release: f.rel}
	if cfg.Kubernetes {
		cfg.PodsPerNode = 0
	} else {
		cfg.AgentMode = ""
	}
	st, err := lab.Up(ctx, cfg, out)
	if err != nil {
		return err
	}
	if st.Kube != nil {
		fmt.Fprintf(out, "lab %s is up; `weir lab status` shows it, `weir lab kubectl get pods -A` lists its pods, `weir lab down` removes it\n", st.Config.Name)
	} else {
		fmt.Fprintf(out, "lab %s is up; `weir lab check` probes it, `weir lab down` removes it\n", st.Config.Name)
	}
	if f.demo {
		if st.Kube == nil {
			return fmt.Errorf("--demo needs the Kubernetes lab (drop --bare)")
		}
		if err := lab.Demo(ctx, st, out); err != nil {
			return err
		}
	}
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
	cmd.Flags().StringVar(&name, "name", defaultLabName(), "lab name (default: $WEIR_LAB if set)")
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
	cmd.Flags().StringVar(&name, "name", defaultLabName(), "lab name (default: $WEIR_LAB if set)")
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

func newLabUpgradeCommand() *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "upgrade",
		Short: "Upgrade a lab that came up with --release to the tree's chart and image (helm upgrade; the agents roll node by node)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := lab.Load(name)
			if err != nil {
				return err
			}
			if err := st.UpgradeWeir(cmd.Context()); err != nil {
				return err
			}
			if _, err := st.Kubectl(cmd.Context(), nil, "-n", "kube-system", "rollout", "status", "daemonset/weir-agent", "--timeout=5m"); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "lab %s runs the tree's Weir\n", st.Config.Name)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", defaultLabName(), "lab name (default: $WEIR_LAB if set)")
	return cmd
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
	cmd.Flags().StringVar(&name, "name", defaultLabName(), "lab name (default: $WEIR_LAB if set)")
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: json, or empty for a table")
	return cmd
}

func printLabStatus(ctx context.Context, st *lab.State, output string, out io.Writer) error {
	if output == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	if st.Kube != nil {
		return printKubeLabStatus(ctx, st, out)
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

// printKubeLabStatus shows a Kubernetes lab: every server and whether it
// runs, each Node as the API server sees it, each agent as it sees itself.
func printKubeLabStatus(ctx context.Context, st *lab.State, out io.Writer) error {
	fmt.Fprintf(out, "lab %s: Kubernetes %s, %s mode, kubeconfig %s\n", st.Config.Name, st.Kube.Version, st.Config.Mode, st.Kube.Kubeconfig)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVER\tPID\tSTATE")
	for _, p := range st.Servers() {
		state := "running"
		if !p.Alive() {
			state = "DOWN (log " + p.Log + ")"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\n", p.Name, p.PID, state)
	}
	tw.Flush()
	ready := map[string]string{}
	if c, err := st.Client(); err == nil {
		nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			fmt.Fprintf(out, "API server: %v\n", err)
		}
		if nodes != nil {
			for _, n := range nodes.Items {
				ready[n.Name] = "NotReady"
				for _, cond := range n.Status.Conditions {
					if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
						ready[n.Name] = "Ready"
					}
				}
			}
		}
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tIP\tSTATUS\tPOD CIDR\tAGENT\tENDPOINTS\tPEERS\tAPI")
	for _, n := range st.Nodes {
		agent, eps, peers, api, cidr := "down", "-", "-", "-", "-"
		if s, err := n.Client().Status(ctx); err == nil {
			agent, eps, peers, cidr = "ready", fmt.Sprint(len(s.Endpoints)), fmt.Sprint(len(s.Peers)), s.PodCIDR.String()
			if k := s.Kubernetes; k != nil {
				api = "synced"
				if !k.Synced {
					api = "syncing"
				}
				if k.ReportError != "" {
					api += ", report failing"
				}
			}
		}
		fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.IP, orDash(ready[n.Name]), cidr, agent, eps, peers, api)
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newLabBuildCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "build",
		Short: "Build (once, then from ~/.cache/weir) etcd, containerd, Kubernetes, agnhost, CoreDNS and the CNI plugins a cluster lab runs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dirs, err := lab.ClusterBinaries(cmd.Context(), cmd.OutOrStdout())
			if err != nil {
				return err
			}
			names := make([]string, 0, len(dirs))
			for name := range dirs {
				names = append(names, name)
			}
			sort.Strings(names)
			for _, name := range names {
				fmt.Fprintf(cmd.OutOrStdout(), "%-11s %s\n", name, dirs[name])
			}
			return nil
		},
	}
}

// newLabAPIProxyCommand is the loopback proxy `weir lab up` starts so the
// root namespace reaches the lab's API server; not for direct use.
func newLabAPIProxyCommand() *cobra.Command {
	var listen, netns, target string
	cmd := &cobra.Command{
		Use:    "api-proxy",
		Short:  "Forward a loopback port to the lab's API server (started by lab up)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return lab.ServeAPIProxy(ctx, listen, netns, target)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "loopback address to listen on")
	cmd.Flags().StringVar(&netns, "netns", "", "network namespace to dial from")
	cmd.Flags().StringVar(&target, "target", "", "address of the API server")
	return cmd
}

// newLabKubectlCommand runs the lab's kubectl with its admin kubeconfig;
// every argument goes to kubectl, so its own flags (-n, -o) work as usual.
func newLabKubectlCommand() *cobra.Command {
	return &cobra.Command{
		Use:                "kubectl ARGS...",
		Short:              "Run the lab's kubectl against the lab's cluster (lab name from $WEIR_LAB, default weir-lab)",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 && args[0] == "--" {
				args = args[1:]
			}
			name := defaultLabName()
			st, err := lab.Load(name)
			if err != nil {
				return err
			}
			if st.Kube == nil {
				return fmt.Errorf("lab %s runs no Kubernetes (it was brought up with --bare)", name)
			}
			c := st.KubectlCommand(cmd.Context(), args...)
			c.Stdin, c.Stdout, c.Stderr = os.Stdin, cmd.OutOrStdout(), cmd.ErrOrStderr()
			return c.Run()
		},
	}
}

// defaultLabName is $WEIR_LAB, else the default lab: one variable points
// every lab command (and kubectl) at the same lab.
func defaultLabName() string {
	if name := os.Getenv("WEIR_LAB"); name != "" {
		return name
	}
	return lab.DefaultName
}

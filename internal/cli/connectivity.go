package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/connectivity"
	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/lab"
)

// NewConnectivityCommand is `weir connectivity`.
func NewConnectivityCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "connectivity", Short: "Check a cluster's pod networking, Services and policy end to end"}
	cmd.AddCommand(newConnectivityTestCommand())
	return cmd
}

func newConnectivityTestCommand() *cobra.Command {
	var (
		kubeconfig, kubeContext, labName, output string
		cfg                                      connectivity.Config
	)
	cmd := &cobra.Command{
		Use:   "test",
		Short: "Deploy probe pods, check every kind of connection and that policies deny and allow what they should, then clean up",
		Long: "Runs against the cluster the kubeconfig reaches (as kubectl would). It deploys probe pods running the\n" +
			"agent's own image in the namespace " + connectivity.DefaultNamespace + " on two nodes, checks pod to pod (one node,\n" +
			"two nodes, TCP and UDP), pod to Service (ClusterIP, DNS name), DNS, pod to node, node to pod and pod to\n" +
			"--external-target, then puts a NetworkPolicy and an Admin ClusterNetworkPolicy in force and checks what\n" +
			"each denies and allows. The deciding rule of each check comes from the judging agent's flows (read through\n" +
			"the agent pods). Exits non-zero when any check fails; removes everything it made unless --keep.",
		Example: "  weir connectivity test\n" +
			"  weir connectivity test --kubeconfig ~/.kube/prod --context east --external-target 203.0.113.10:443\n" +
			"  weir connectivity test --lab weir-lab -o json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			ex, err := clusterExec(kubeconfig, kubeContext, labName)
			if err != nil {
				return err
			}
			if output == "" {
				cfg.Progress = cmd.ErrOrStderr()
			}
			rep, runErr := connectivity.Run(cmd.Context(), connectivity.Cluster{
				Kube: ex.Kube, Dynamic: ex.Dynamic, Exec: ex, Flows: agentFlows(ex),
			}, cfg)
			var err2 error
			if output == "json" {
				err2 = writeIndentedJSON(cmd.OutOrStdout(), rep)
			} else if len(rep.Checks) > 0 {
				err2 = rep.WriteTable(cmd.OutOrStdout())
			}
			return errors.Join(runErr, err2)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&kubeconfig, "kubeconfig", "", "the cluster's kubeconfig (default: $KUBECONFIG, then ~/.kube/config)")
	fl.StringVar(&kubeContext, "context", "", "the kubeconfig's context (default: its current one)")
	fl.StringVar(&labName, "lab", "", "test this lab's cluster (its kubeconfig)")
	fl.StringVarP(&cfg.Namespace, "namespace", "n", connectivity.DefaultNamespace, "namespace to deploy the probes in (made, then deleted)")
	fl.StringVar(&cfg.Image, "image", "", "image for the probes, which run its /usr/bin/weir-agent (default: the weir-agent DaemonSet's, on every node already)")
	fl.StringVar(&cfg.External, "external-target", "", "host:port outside the cluster accepting TCP, for the pod-to-outside check (default: skipped)")
	fl.DurationVar(&cfg.Timeout, "timeout", 3*time.Second, "how long one connection attempt may take")
	fl.DurationVar(&cfg.Settle, "settle", 30*time.Second, "how long a check repeats until it holds (a new policy takes effect)")
	fl.DurationVar(&cfg.PodTimeout, "pod-timeout", 3*time.Minute, "how long the probe pods may take to start (image pulls)")
	fl.BoolVar(&cfg.Keep, "keep", false, "leave the probes and policies in place afterwards, for inspection")
	fl.StringVarP(&output, "output", "o", "", "json: the report as JSON; empty: a table, with progress on standard error")
	return cmd
}

// agentFlows reads a node's flows from its agent pod.
func agentFlows(ex *k8s.Exec) connectivity.FlowReader {
	return func(ctx context.Context, node string, q api.FlowsQuery) ([]api.Flow, error) {
		agents, err := execAgents(ctx, ex)
		if err != nil {
			return nil, err
		}
		for _, a := range agents {
			if a.node != node {
				continue
			}
			if a.err != nil {
				return nil, fmt.Errorf("%s: %w", a.label(), a.err)
			}
			var out []api.Flow
			err := a.client.Flows(ctx, q, func(f api.Flow) error {
				out = append(out, f)
				return nil
			})
			return out, err
		}
		return nil, fmt.Errorf("node %s: %w", node, k8s.ErrNoAgentPod)
	}
}

// clusterExec reaches the cluster of a kubeconfig and context, or of a
// lab (its admin kubeconfig).
func clusterExec(kubeconfig, kubeContext, labName string) (*k8s.Exec, error) {
	if labName != "" {
		if kubeconfig != "" {
			return nil, errors.New("--lab and --kubeconfig: give one")
		}
		st, err := lab.Load(labName)
		if err != nil {
			return nil, err
		}
		if st.Kube == nil {
			return nil, fmt.Errorf("lab %s runs no Kubernetes (weir lab up --kubernetes)", labName)
		}
		kubeconfig = st.Kube.Kubeconfig
	}
	return k8s.NewExec(kubeconfig, kubeContext)
}

package cli

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/weirnet/weir/internal/uninstall"
)

// NewUninstallCommand is `weir uninstall`.
func NewUninstallCommand() *cobra.Command {
	var kubeconfig, kubeContext, labName, output string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Stop Weir's agents and remove everything they put on every node; then helm uninstall removes the rest",
		Long: "Deletes the weir-agent DaemonSet, waits for its pods to end, then runs `weir-agent uninstall` on every\n" +
			"node in a Job built from the agent's pod template (its image, host mounts and ConfigMap, so the same\n" +
			"paths): pod veths, routes, the overlay device, the masquerade table, programs and pins, the CNI config\n" +
			"and plugin, the agent's state. Pods still running lose their network: delete them, or drain the nodes\n" +
			"first, and install the next CNI. Run it before `helm uninstall`, which removes the release's other\n" +
			"objects; Helm keeps the CRDs (and the policies in them).",
		Example: "  weir uninstall && helm uninstall weir -n kube-system\n" +
			"  weir uninstall --kubeconfig ~/.kube/prod -o json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			ex, err := clusterExec(kubeconfig, kubeContext, labName)
			if err != nil {
				return err
			}
			nodes, runErr := uninstall.Run(cmd.Context(), ex.Kube, timeout, cmd.ErrOrStderr())
			if output == "json" {
				return errors.Join(runErr, writeIndentedJSON(cmd.OutOrStdout(), nodes))
			}
			out := cmd.OutOrStdout()
			for _, n := range nodes {
				state := "clean"
				if !n.OK {
					state = "NOT CLEAN"
				}
				fmt.Fprintf(out, "node %s: %s\n", n.Name, state)
				for _, line := range strings.Split(n.Log, "\n") {
					fmt.Fprintf(out, "  %s\n", line)
				}
			}
			if runErr == nil {
				fmt.Fprintln(out, "\nEvery node is clean. Now `helm uninstall <release> -n <namespace>` removes the release's other objects.")
			}
			return runErr
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&kubeconfig, "kubeconfig", "", "the cluster's kubeconfig (default: $KUBECONFIG, then ~/.kube/config)")
	fl.StringVar(&kubeContext, "context", "", "the kubeconfig's context (default: its current one)")
	fl.StringVar(&labName, "lab", "", "uninstall from this lab's cluster (its kubeconfig)")
	fl.DurationVar(&timeout, "timeout", 5*time.Minute, "how long each step may take (the agents ending, the nodes' cleanup)")
	fl.StringVarP(&output, "output", "o", "", "json: each node's result as JSON; empty: text")
	return cmd
}

package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/lab"
)

// agentTarget is where a command finds node agents: the one agent on
// this node (--socket), every node of a lab (--lab), or every node's
// agent pod of a cluster, reached through its API server (--kubeconfig;
// also by default off a node, with $KUBECONFIG or ~/.kube/config).
type agentTarget struct {
	socket, labName, kubeconfig, kubeContext string
	flags                                    *pflag.FlagSet
}

// register adds the target's flags; labHelp says what --lab does.
func (t *agentTarget) register(fl *pflag.FlagSet, labHelp string) {
	t.flags = fl
	fl.StringVar(&t.socket, "socket", api.DefaultSocket, "the agent's unix socket on this node")
	fl.StringVar(&t.labName, "lab", "", labHelp)
	fl.StringVar(&t.kubeconfig, "kubeconfig", "", "ask every node's agent pod of the cluster this kubeconfig reaches, through its API server "+
		"(needs pods/exec in the agents' namespace; by default, where this node has no agent socket: $KUBECONFIG or ~/.kube/config)")
	fl.StringVar(&t.kubeContext, "context", "", "the kubeconfig's context to use (default: its current one)")
}

// agentConn is one node's agent, or why it cannot be asked.
type agentConn struct {
	node   string // empty for the one agent at --socket
	where  string // the socket, or the agent pod
	client *api.Client
	err    error
}

// agentRelay is what the CLI runs in an agent pod to reach its socket.
var agentRelay = []string{"/usr/bin/weir-agent", "relay"}

// agents lists the target's agents in node order.
func (t *agentTarget) agents(ctx context.Context) ([]agentConn, error) {
	switch {
	case t.labName != "":
		st, err := lab.Load(t.labName)
		if err != nil {
			return nil, err
		}
		out := make([]agentConn, 0, len(st.Nodes))
		for _, n := range st.Nodes {
			out = append(out, agentConn{node: n.Name, where: n.Socket, client: api.NewClient(n.Socket)})
		}
		sort.Slice(out, func(i, j int) bool { return out[i].node < out[j].node })
		return out, nil
	case t.useCluster():
		return t.clusterAgents(ctx)
	}
	return []agentConn{{where: t.socket, client: api.NewClient(t.socket)}}, nil
}

// useCluster: --kubeconfig or --context given, or neither --socket given
// nor an agent socket here while a kubeconfig is.
func (t *agentTarget) useCluster() bool {
	if t.kubeconfig != "" || t.kubeContext != "" {
		return true
	}
	if t.flags != nil && t.flags.Changed("socket") {
		return false
	}
	if _, err := os.Stat(t.socket); err == nil {
		return false
	}
	if os.Getenv("KUBECONFIG") != "" {
		return true
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return false
	}
	_, err = os.Stat(filepath.Join(home, ".kube", "config"))
	return err == nil
}

// clusterAgents reaches every node's agent pod with weir-agent relay run
// through the API server, one exec per request.
func (t *agentTarget) clusterAgents(ctx context.Context) ([]agentConn, error) {
	ex, err := k8s.NewExec(t.kubeconfig, t.kubeContext)
	if err != nil {
		return nil, err
	}
	return execAgents(ctx, ex)
}

// execAgents reaches every node's agent pod of the cluster ex reaches.
func execAgents(ctx context.Context, ex *k8s.Exec) ([]agentConn, error) {
	pods, err := k8s.AgentPods(ctx, ex.Kube)
	if err != nil {
		return nil, err
	}
	out := make([]agentConn, 0, len(pods))
	for _, p := range pods {
		a := agentConn{node: p.Node, where: "pod " + p.Pod.String(), err: p.Err}
		if p.Err == nil {
			a.client = api.NewDialClient(a.where, func(ctx context.Context) (net.Conn, error) {
				return ex.Dial(ctx, p.Pod, agentRelay...)
			})
		}
		out = append(out, a)
	}
	return out, nil
}

// label is how output and errors name an agent.
func (a agentConn) label() string {
	if a.node == "" {
		return a.where
	}
	return fmt.Sprintf("node %s (%s)", a.node, a.where)
}

// agentsCommand describes a command that shows something each node agent
// answers: one agent (--socket) or every node of a lab (--lab), as text
// or JSON (-o json).
type agentsCommand struct {
	use, short, example string
	// textFormat names the text output in --output's help.
	textFormat string
	show       func(ctx context.Context, c *api.Client, asJSON bool, out io.Writer) error
}

// newAgentsCommand builds the command: its flags, and a run over the
// agents in node order that reports every agent's failure.
func newAgentsCommand(d agentsCommand) *cobra.Command {
	var output string
	var target agentTarget
	cmd := &cobra.Command{
		Use: d.use, Short: d.short, Example: d.example,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			agents, err := target.agents(cmd.Context())
			if err != nil {
				return err
			}
			var errs []error
			for _, a := range agents {
				err := a.err
				if err == nil {
					err = d.show(cmd.Context(), a.client, output == "json", cmd.OutOrStdout())
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", a.label(), err))
				}
			}
			return errors.Join(errs...)
		},
	}
	target.register(cmd.Flags(), "show every node of this lab instead of one agent")
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: json, or empty for "+d.textFormat)
	return cmd
}

// writeIndentedJSON writes v as indented JSON.
func writeIndentedJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// checkOutput refuses an --output other than json or empty (text).
func checkOutput(output string) error {
	if output != "" && output != "json" {
		return fmt.Errorf("--output %q: want json or empty", output)
	}
	return nil
}

package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/spf13/cobra"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/lab"
)

// agentSockets maps node name to agent socket: every node of labName, or
// the one agent at socket (node name empty) when labName is empty.
func agentSockets(socket, labName string) (map[string]string, error) {
	if labName == "" {
		return map[string]string{"": socket}, nil
	}
	st, err := lab.Load(labName)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, n := range st.Nodes {
		out[n.Name] = n.Socket
	}
	return out, nil
}

// sortedNodes lists the node names of sockets in order.
func sortedNodes(sockets map[string]string) []string {
	out := make([]string, 0, len(sockets))
	for n := range sockets {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
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
	var socket, labName, output string
	cmd := &cobra.Command{
		Use: d.use, Short: d.short, Example: d.example,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			sockets, err := agentSockets(socket, labName)
			if err != nil {
				return err
			}
			var errs []error
			for _, node := range sortedNodes(sockets) {
				if err := d.show(cmd.Context(), api.NewClient(sockets[node]), output == "json", cmd.OutOrStdout()); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", sockets[node], err))
				}
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().StringVar(&socket, "socket", api.DefaultSocket, "the agent's unix socket")
	cmd.Flags().StringVar(&labName, "lab", "", "show every node of this lab instead of one agent")
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

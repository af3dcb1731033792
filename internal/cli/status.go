package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"

	"github.com/spf13/cobra"

	"github.com/weirnet/weir/internal/api"
)

// NewStatusCommand is `weir status`: one node agent's view of its node.
func NewStatusCommand() *cobra.Command {
	var (
		socket string
		output string
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show a node agent's status: endpoints, peers and datapath counters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runStatus(cmd.Context(), api.NewClient(socket), output, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&socket, "socket", api.DefaultSocket, "the agent's unix socket")
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: json, or empty for text")
	return cmd
}

func runStatus(ctx context.Context, c *api.Client, output string, out io.Writer) error {
	s, err := c.Status(ctx)
	if err != nil {
		return err
	}
	if output == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	fmt.Fprintf(out, "node %s: %s mode, node IP %v, pod CIDR %v (%d/%d used), MTU %d\n",
		s.Node, s.Mode, s.NodeIP, s.PodCIDR, len(s.Endpoints), s.Capacity, s.MTU)
	for _, e := range s.Endpoints {
		fmt.Fprintf(out, "  endpoint %-15v %-15s %s/%s\n", e.Address, e.HostIfName, e.PodNamespace, e.PodName)
	}
	for _, p := range s.Peers {
		fmt.Fprintf(out, "  peer %-6s %-15v %v\n", p.Name, p.NodeIP, p.PodCIDR)
	}
	names := make([]string, 0, len(s.Counters))
	for k := range s.Counters {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(out, "  counter %-16s %d\n", k, s.Counters[k])
	}
	return nil
}

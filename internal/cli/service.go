package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

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

// NewServiceCommand is `weir service`: the Services a node translates.
func NewServiceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "service",
		Short: "Show how nodes translate Service addresses",
	}
	cmd.AddCommand(newServiceListCommand())
	return cmd
}

func newServiceListCommand() *cobra.Command {
	var socket, labName, output string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List each Service address a node translates, its backends and its state, read from the node's service maps",
		Example: "  weir service list --lab weir-lab\n" +
			"  weir service list --socket /run/weir/agent.sock -o json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "" && output != "json" {
				return fmt.Errorf("--output %q: want json or empty", output)
			}
			sockets, err := agentSockets(socket, labName)
			if err != nil {
				return err
			}
			var errs []error
			for _, node := range sortedNodes(sockets) {
				if err := runServiceList(cmd.Context(), api.NewClient(sockets[node]), output, cmd.OutOrStdout()); err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", sockets[node], err))
				}
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().StringVar(&socket, "socket", api.DefaultSocket, "the agent's unix socket")
	cmd.Flags().StringVar(&labName, "lab", "", "show every node of this lab instead of one agent")
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: json, or empty for a table")
	return cmd
}

func runServiceList(ctx context.Context, c *api.Client, output string, out io.Writer) error {
	l, err := c.Services(ctx)
	if err != nil {
		return err
	}
	if output == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(l)
	}
	return printServiceList(l, out)
}

// printServiceList writes l as a table, one frontend a row.
func printServiceList(l *api.ServiceList, out io.Writer) error {
	kpr := "kube-proxy beside it"
	if l.KubeProxyReplacement {
		kpr = "no kube-proxy"
	}
	sync := "maps match the Services"
	if !l.InSync {
		sync = "maps NOT in sync with the Services (a write failed; see weir status)"
	}
	fmt.Fprintf(out, "node %s: %d Service addresses, %s, %s\n", l.Node, len(l.Frontends), kpr, sync)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "FRONTEND\tFROM\tSERVICE\tSTATE\tAFFINITY\tBACKENDS")
	for _, f := range l.Frontends {
		affinity := "-"
		if f.AffinitySeconds > 0 {
			affinity = "ClientIP " + strconv.Itoa(f.AffinitySeconds) + "s"
		}
		name := f.Service
		if name == "" {
			name = "?"
		}
		bes := make([]string, 0, len(f.Backends))
		for _, b := range f.Backends {
			bes = append(bes, netip.AddrPortFrom(b.Addr, b.Port).String())
		}
		backends := strings.Join(bes, ", ")
		switch {
		case backends != "":
		case f.State == "dropping":
			backends = "(none here: dropped)"
		default:
			backends = "(none: new connections refused)"
		}
		from := "cluster"
		if f.External {
			from = "outside"
		}
		fmt.Fprintf(w, "%s/%s\t%s\t%s\t%s\t%s\t%s\n", netip.AddrPortFrom(f.Addr, f.Port), f.Protocol, from, name, f.State, affinity, backends)
	}
	return w.Flush()
}

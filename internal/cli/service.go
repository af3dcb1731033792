package cli

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/weirnet/weir/internal/api"
)

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
	return newAgentsCommand(agentsCommand{
		use:   "list",
		short: "List each Service address a node translates, its backends and its state, read from the node's service maps",
		example: "  weir service list --lab weir-lab\n" +
			"  weir service list --socket /run/weir/agent.sock -o json",
		textFormat: "a table",
		show: func(ctx context.Context, c *api.Client, asJSON bool, out io.Writer) error {
			l, err := c.Services(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				return writeIndentedJSON(out, l)
			}
			return printServiceList(l, out)
		},
	})
}

// printServiceList writes l as a table, one frontend a row.
func printServiceList(l *api.ServiceList, out io.Writer) error {
	kpr := "kube-proxy beside it"
	switch {
	case l.KubeProxyReplacement:
		kpr = "no kube-proxy"
	case l.SocketLBOff:
		kpr = "kube-proxy answers every Service (--socket-lb=false)"
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

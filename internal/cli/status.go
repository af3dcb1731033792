package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"github.com/weirnet/weir/internal/api"
)

// NewStatusCommand is `weir status`: each node agent's view of its node.
func NewStatusCommand() *cobra.Command {
	return newAgentsCommand(agentsCommand{
		use:   "status",
		short: "Show node agents' status: endpoints, peers, loaded policy, map fill and datapath counters",
		example: "  weir status --socket /run/weir-lab/n1/agent.sock\n" +
			"  weir status --lab weir-lab -o json",
		textFormat: "text",
		show: func(ctx context.Context, c *api.Client, asJSON bool, out io.Writer) error {
			s, err := c.Status(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				return writeIndentedJSON(out, s)
			}
			printStatus(s, out)
			return nil
		},
	})
}

func printStatus(s *api.Status, out io.Writer) {
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
	printPolicyStatus(s.Policy, out)
	printServicesSummary(s.Services, out)
}

func printServicesSummary(sv *api.ServicesSummary, out io.Writer) {
	if sv == nil {
		return
	}
	kpr := "kube-proxy answers the rest"
	switch {
	case sv.KubeProxyReplacement:
		kpr = "no kube-proxy"
	case sv.SocketLBOff:
		kpr = "kube-proxy answers every Service (--socket-lb=false)"
	}
	fmt.Fprintf(out, "  services %d addresses, %d backends, %d refusing (no backend); %s (weir service list)\n",
		sv.Frontends, sv.Backends, sv.Refusing, kpr)
	if sv.Error != "" {
		fmt.Fprintf(out, "  services last write FAILED (retried on the next change): %s\n", sv.Error)
	}
}

func printPolicyStatus(p *api.PolicyStatus, out io.Writer) {
	if p == nil {
		return
	}
	state := "loaded " + p.Loaded.Format(time.RFC3339)
	if p.Loaded.IsZero() {
		state = "not loaded yet"
	}
	if p.Error != "" {
		state += ", last load FAILED (its endpoints fail closed): " + p.Error
	}
	fmt.Fprintf(out, "  policy %s: %d endpoints, %d rules, %d map entries\n", state, p.Endpoints, p.Rules, p.Entries)
	for _, e := range p.CompileErrors {
		fmt.Fprintf(out, "  policy error %s\n", e)
	}
	refs := make([]string, 0, len(p.ClusterPolicies))
	for ref := range p.ClusterPolicies {
		refs = append(refs, ref)
	}
	sort.Strings(refs)
	for _, ref := range refs {
		fmt.Fprintf(out, "  cluster policy %s generation %d programmed\n", ref, p.ClusterPolicies[ref])
	}
	maps := make([]string, 0, len(p.Maps))
	for m := range p.Maps {
		maps = append(maps, m)
	}
	sort.Strings(maps)
	for _, m := range maps {
		f := p.Maps[m]
		pct := 0.0
		if f.Capacity > 0 {
			pct = 100 * float64(f.Entries) / float64(f.Capacity)
		}
		fmt.Fprintf(out, "  map %-16s %d/%d (%.1f%%)\n", m, f.Entries, f.Capacity, pct)
	}
}

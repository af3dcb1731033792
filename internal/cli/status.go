package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
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
				err = writeIndentedJSON(out, s)
			} else {
				printStatus(s, out)
			}
			if problems := statusProblems(s); len(problems) > 0 {
				return errors.Join(err, fmt.Errorf("%w: %s", errUnhealthy, strings.Join(problems, "; ")))
			}
			return err
		},
	})
}

// errUnhealthy is wrapped by the error of `weir status` for an agent that
// reported a problem: the command prints everything, then exits non-zero.
var errUnhealthy = errors.New("unhealthy")

// mapFullWarn is the fill at which a datapath map counts as a problem:
// past it, new connections, endpoints or rules may find no room.
const mapFullWarn = 0.9

// statusProblems lists what keeps an agent from doing its job: not
// synced with the API server, not reporting to its Node, a failed policy
// load or Service map write, a map nearly full. Policies that do not
// compile are not among them: they fail closed, as meant, and are listed
// as policy errors.
func statusProblems(s *api.Status) []string {
	var out []string
	if !s.Ready {
		out = append(out, "agent not ready")
	}
	if k := s.Kubernetes; k != nil {
		if !k.Synced {
			out = append(out, "not yet synced with the API server")
		}
		if k.ReportError != "" {
			out = append(out, "cannot report to its Node: "+k.ReportError)
		}
	}
	if p := s.Policy; p != nil {
		if p.Error != "" {
			out = append(out, "last policy load failed (its endpoints fail closed): "+p.Error)
		}
		for _, m := range slices.Sorted(maps.Keys(p.Maps)) {
			if f := p.Maps[m]; f.Capacity > 0 && float64(f.Entries) >= mapFullWarn*float64(f.Capacity) {
				out = append(out, fmt.Sprintf("map %s %d/%d full", m, f.Entries, f.Capacity))
			}
		}
	}
	if sv := s.Services; sv != nil && sv.Error != "" {
		out = append(out, "last Service map write failed: "+sv.Error)
	}
	return out
}

func printStatus(s *api.Status, out io.Writer) {
	fmt.Fprintf(out, "node %s: %s mode, node IP %v, pod CIDR %v (%d/%d used), MTU %d\n",
		s.Node, s.Mode, s.NodeIP, s.PodCIDR, len(s.Endpoints), s.Capacity, s.MTU)
	if problems := statusProblems(s); len(problems) > 0 {
		fmt.Fprintf(out, "  health UNHEALTHY: %s\n", strings.Join(problems, "; "))
	} else {
		fmt.Fprintf(out, "  health ok\n")
	}
	for _, e := range s.Endpoints {
		fmt.Fprintf(out, "  endpoint %-15v %-15s %s/%s\n", e.Address, e.HostIfName, e.PodNamespace, e.PodName)
	}
	for _, p := range s.Peers {
		fmt.Fprintf(out, "  peer %-6s %-15v %v\n", p.Name, p.NodeIP, p.PodCIDR)
	}
	for _, k := range slices.Sorted(maps.Keys(s.Counters)) {
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
	for _, w := range p.Warnings {
		fmt.Fprintf(out, "  policy warning %s\n", w)
	}
	for _, ref := range slices.Sorted(maps.Keys(p.ClusterPolicies)) {
		kind := "cluster policy"
		if strings.HasPrefix(ref, "WeirNetworkPolicy/") {
			kind = "policy" // namespaced: WeirNetworkPolicy/namespace/name
		}
		fmt.Fprintf(out, "  %s %s generation %d programmed\n", kind, ref, p.ClusterPolicies[ref])
	}
	for _, m := range slices.Sorted(maps.Keys(p.Maps)) {
		f := p.Maps[m]
		pct := 0.0
		if f.Capacity > 0 {
			pct = 100 * float64(f.Entries) / float64(f.Capacity)
		}
		fmt.Fprintf(out, "  map %-16s %d/%d (%.1f%%)\n", m, f.Entries, f.Capacity, pct)
	}
}

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

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/weirnet/weir/internal/api"
)

// ErrTraceDisagrees is returned when an agent's compiled policy and its
// datapath decide a traced flow differently.
var ErrTraceDisagrees = errors.New("compiled policy and datapath disagree")

// NewPolicyCommand is `weir policy`.
func NewPolicyCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "Explain and check network policy"}
	cmd.AddCommand(newPolicyTraceCommand())
	return cmd
}

type traceFlags struct {
	target    agentTarget
	namespace string
	output    string
	// method, path, host and headers name an HTTP request to judge too.
	method, path, host string
	headers            []string
}

// traceClient is the part of the agent API a trace needs.
type traceClient interface {
	Trace(context.Context, api.TraceQuery) (*api.Trace, error)
}

func newPolicyTraceCommand() *cobra.Command {
	f := traceFlags{}
	cmd := &cobra.Command{
		Use:   "trace SRC DST PORT/PROTO",
		Short: "Say which rule of which policy decides a flow, and confirm it in the loaded eBPF programs",
		Long: "SRC and DST are pods (namespace/name, or a name in -n's namespace) or IP addresses;\n" +
			"PORT/PROTO is 80/tcp, 53/udp or icmp. Each agent holding an end of the flow explains\n" +
			"its decision from its compiled policy and runs the flow's first packet through its\n" +
			"programs with BPF_PROG_RUN (no connection, event or counter of the live datapath changes).\n" +
			"The command fails when the two disagree.",
		Example: "  weir policy trace --lab weir-lab -n demo frontend db 5432/tcp\n" +
			"  weir policy trace demo/frontend 10.96.0.10 53/udp -o json\n" +
			"  weir policy trace --lab weir-lab -n empire tiefighter deathstar-0 80/tcp --method PUT --path /v1/exhaust-port",
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			q, err := parseTraceArgs(args, f.namespace)
			if err != nil {
				return err
			}
			if q.HTTP, err = f.request(q.Proto); err != nil {
				return err
			}
			if err := validateOutput(f.output); err != nil {
				return err
			}
			agents, err := f.target.agents(cmd.Context())
			if err != nil {
				return err
			}
			clients := map[string]traceClient{}
			for _, a := range agents {
				clients[a.node] = a.client
				if a.err != nil {
					clients[a.node] = unreachableTracer{fmt.Errorf("%s: %w", a.label(), a.err)}
				}
			}
			return runTrace(cmd.Context(), q, f.output, clients, cmd.OutOrStdout())
		},
	}
	f.target.register(cmd.Flags(), "ask the agents of this lab's nodes that hold SRC and DST")
	cmd.Flags().StringVarP(&f.namespace, "namespace", "n", "default", "namespace of pod names given without one")
	cmd.Flags().StringVarP(&f.output, "output", "o", "", "output format: json, yaml, wide, or empty for text")
	cmd.Flags().StringVar(&f.method, "method", "", "also judge an HTTP request of the connection with this method (needs --path)")
	cmd.Flags().StringVar(&f.path, "path", "", "the HTTP request's path, with any query (e.g. /v1/status?x=1)")
	cmd.Flags().StringVar(&f.host, "host", "", "the HTTP request's Host (default: one no hostname rule matches)")
	cmd.Flags().StringArrayVar(&f.headers, "header", nil, `a header field of the HTTP request, "Name: value" (repeat for more)`)
	return cmd
}

// request is the HTTP request the flags name, nil for none.
func (f *traceFlags) request(proto string) (*api.TraceRequest, error) {
	if f.method == "" && f.path == "" && f.host == "" && len(f.headers) == 0 {
		return nil, nil
	}
	switch {
	case f.method == "" || f.path == "":
		return nil, errors.New("an HTTP trace needs both --method and --path (e.g. --method GET --path /v1/status)")
	case !strings.HasPrefix(f.path, "/"):
		return nil, fmt.Errorf("--path %q: want a path starting with /", f.path)
	case proto != "tcp":
		return nil, fmt.Errorf("an HTTP request needs a TCP port (80/tcp), not %s", proto)
	}
	return &api.TraceRequest{Method: f.method, Path: f.path, Host: f.host, Headers: f.headers}, nil
}

func validateOutput(o string) error {
	switch o {
	case "", "json", "yaml", "wide":
		return nil
	}
	return fmt.Errorf("output %q: want json, yaml or wide", o)
}

// parseTraceArgs turns SRC DST PORT/PROTO into a query; names without a
// namespace get ns.
func parseTraceArgs(args []string, ns string) (api.TraceQuery, error) {
	if len(args) != 3 {
		return api.TraceQuery{}, errors.New("want SRC DST PORT/PROTO")
	}
	q := api.TraceQuery{Src: qualify(args[0], ns), Dst: qualify(args[1], ns)}
	for _, s := range []string{q.Src, q.Dst} {
		if s == "" || strings.HasPrefix(s, "/") || strings.HasSuffix(s, "/") || strings.Count(s, "/") > 1 {
			return q, fmt.Errorf("%q: want a pod (namespace/name or name) or an IP address", s)
		}
	}
	var err error
	q.Port, q.Proto, err = parsePortProto(args[2])
	return q, err
}

func qualify(s, ns string) string {
	if _, err := netip.ParseAddr(s); err == nil || strings.Contains(s, "/") || s == "" {
		return s
	}
	return ns + "/" + s
}

// parsePortProto parses 80/tcp, 53/udp or icmp.
func parsePortProto(s string) (uint16, string, error) {
	lower := strings.ToLower(s)
	if lower == "icmp" {
		return 0, "icmp", nil
	}
	port, proto, ok := strings.Cut(lower, "/")
	if !ok || (proto != "tcp" && proto != "udp") {
		return 0, "", fmt.Errorf("%q: want PORT/PROTO with PROTO tcp or udp (80/tcp, 53/udp), or icmp", s)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return 0, "", fmt.Errorf("%q: port %q is not a number from 1 to 65535", s, port)
	}
	return uint16(n), proto, nil
}

// unreachableTracer stands for a node whose agent cannot be asked.
type unreachableTracer struct{ err error }

func (u unreachableTracer) Trace(context.Context, api.TraceQuery) (*api.Trace, error) {
	return nil, u.err
}

// runTrace asks every client, keeps the answers of the nodes holding an
// end of the flow, prints them and fails when any disagrees.
func runTrace(ctx context.Context, q api.TraceQuery, output string, clients map[string]traceClient, out io.Writer) error {
	nodes := make([]string, 0, len(clients))
	for n := range clients {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	var (
		traces   []*api.Trace
		notLocal []error
	)
	for _, node := range nodes {
		t, err := clients[node].Trace(ctx, q)
		var e *api.Error
		switch {
		case err == nil:
			traces = append(traces, t)
		case len(clients) > 1 && errors.As(err, &e) && e.Code == api.CodeTraceNotLocal:
			notLocal = append(notLocal, err) // another node holds the ends
		case node == "":
			return err
		default:
			return fmt.Errorf("node %s: %w", node, err)
		}
	}
	if len(traces) == 0 {
		return fmt.Errorf("no node holds an end of the flow: %w", errors.Join(notLocal...))
	}
	if err := printTraces(out, traces, output); err != nil {
		return err
	}
	for _, t := range traces {
		if !t.Agree {
			fmt.Fprintf(out, "\n!!! %s: on node %s the compiled policy and the datapath DISAGREE about this flow: this is a Weir bug, please report it with the output above (-o yaml)\n",
				strings.ToUpper(ErrTraceDisagrees.Error()), t.Node)
			return fmt.Errorf("node %s: %w", t.Node, ErrTraceDisagrees)
		}
	}
	return nil
}

func printTraces(out io.Writer, traces []*api.Trace, output string) error {
	switch output {
	case "json":
		b, err := json.MarshalIndent(traces, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(out, string(b))
		return err
	case "yaml":
		b, err := yaml.Marshal(traces)
		if err != nil {
			return err
		}
		_, err = out.Write(b)
		return err
	}
	for i, t := range traces {
		if i > 0 {
			fmt.Fprintln(out)
		}
		printTrace(out, t, output == "wide")
	}
	return nil
}

// printTrace is the text form of one node's answer.
func printTrace(out io.Writer, t *api.Trace, wide bool) {
	flow := strings.ToUpper(t.Proto)
	if t.Port != 0 {
		flow = fmt.Sprintf("%d/%s", t.Port, flow)
	}
	fmt.Fprintf(out, "%s -> %s %s, on node %s:\n", peerText(t.Src), peerText(t.Dst), flow, t.Node)
	for _, e := range t.Ends {
		fmt.Fprintf(out, "\n%s\n", endHeadline(e))
		if wide {
			fmt.Fprintf(out, "  selected by: %s (networkpolicy enforced: %t, cluster policy tiers: %t)\n", orNone(e.Policies), e.Enforced, e.Tiered)
			fmt.Fprintf(out, "  peer identity: %s, peer CIDR identity: %s\n", e.PeerIdentity, e.PeerCIDRIdentity)
		}
		for _, s := range e.Steps {
			fmt.Fprintf(out, "  %s\n", s)
		}
		fmt.Fprintf(out, "  %s\n", datapathLine(e))
	}
	agree := "compiled policy and datapath agree"
	if !t.Agree {
		agree = "compiled policy and datapath DISAGREE"
	}
	fmt.Fprintf(out, "\nflow %s; %s returned %s - %s\n", t.Verdict, t.Program, t.TCVerdict, agree)
	printTraceHTTP(out, "HTTP request, by the server's ingress rules:", t.HTTP)
	printTraceHTTP(out, "HTTP request, by the client's egress rules:", t.EgressHTTP)
}

// printTraceHTTP is the text form of a trace's HTTP verdict.
func printTraceHTTP(out io.Writer, title string, h *api.TraceHTTP) {
	if h == nil {
		return
	}
	fmt.Fprintln(out, "\n"+title)
	if h.Verdict != "" {
		fmt.Fprintf(out, "  %s: %s\n", strings.ToUpper(h.Verdict), h.Rule)
	}
	if h.Note != "" {
		fmt.Fprintf(out, "  %s\n", h.Note)
	}
	if len(h.Rules) > 0 {
		fmt.Fprintln(out, "  judged against:")
		for _, r := range h.Rules {
			fmt.Fprintf(out, "    %s\n", r)
		}
	}
	if h.Kernel != "" {
		fmt.Fprintf(out, "  where: %s\n", h.Kernel)
	}
}

func peerText(p api.TracePeer) string {
	s := p.IP
	if p.Pod != "" {
		s = p.Pod + " (" + p.IP + ")"
	}
	if p.Node != "" && !p.Local {
		s += " on " + p.Node
	}
	return s
}

func orNone(ss []string) string {
	if len(ss) == 0 {
		return "none"
	}
	return strings.Join(ss, ", ")
}

// endHeadline: "egress of demo/frontend: DENIED at admin by <rule>; logged by <rule>".
func endHeadline(e api.TraceEnd) string {
	c := e.Compiled
	s := fmt.Sprintf("%s of %s: %s at %s", e.Direction, e.Pod, strings.ToUpper(c.Verdict), c.Stage)
	if c.RuleName != "" {
		s += " by " + c.RuleName
	}
	if c.PassedName != "" {
		s += "; passed on by " + c.PassedName
	}
	if c.LogName != "" {
		s += "; logged by " + c.LogName
	}
	return s
}

func datapathLine(e api.TraceEnd) string {
	agree := " - agrees"
	if !e.Agree {
		agree = " - DISAGREES"
	}
	d := e.Datapath
	if d == nil {
		if e.Agree {
			return "datapath (BPF_PROG_RUN): not reached, dropped at the source's egress" + agree
		}
		return "datapath (BPF_PROG_RUN): no verdict for this end" + agree
	}
	s := "datapath (BPF_PROG_RUN): " + d.Verdict
	switch {
	case d.Rule != 0:
		s += fmt.Sprintf(" by rule %d", d.Rule)
	default:
		s += " at " + d.Stage
	}
	if d.Log != 0 {
		s += fmt.Sprintf(", logged by rule %d", d.Log)
	}
	if d.Passed != 0 {
		s += fmt.Sprintf(", passed by rule %d", d.Passed)
	}
	if !e.Agree {
		s += fmt.Sprintf(" (datapath stage %s rule %d, compiled stage %s rule %d)", d.Stage, d.Rule, e.Compiled.Stage, e.Compiled.Rule)
	}
	return s + agree
}

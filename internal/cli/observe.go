package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/weirnet/weir/internal/api"
)

type observeFlags struct {
	target    agentTarget
	follow    bool
	output    string
	namespace string
	pod       string
	verdict   string
	policy    string
	port      int
	since     time.Duration
	selector  string
	service   string
	limit     int
	before    string
	http      bool
	method    string
	path      string
	status    int

	// query is the flags as the agents run them, set by validate.
	query api.FlowsQuery
}

// NewObserveCommand is `weir observe`: policy verdicts as they happen.
func NewObserveCommand() *cobra.Command {
	f := observeFlags{}
	cmd := &cobra.Command{
		Use:   "observe",
		Short: "Show policy verdicts (drops and new allowed connections) with the pod, peer and rule that decided",
		Example: "  weir observe --lab weir-lab --verdict denied\n" +
			"  weir observe --lab weir-lab -n demo -f -o json\n" +
			"  weir observe --lab weir-lab --policy deny-db --port 5432 --since 10m\n" +
			"  weir observe --lab weir-lab -l app=frontend -o yaml\n" +
			"  weir observe --lab weir-lab --http --status 403 -n empire",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.validate(); err != nil {
				return err
			}
			agents, err := f.target.agents(cmd.Context())
			if err != nil {
				return err
			}
			return runObserve(cmd.Context(), &f, agents, cmd.OutOrStdout())
		},
	}
	f.target.register(cmd.Flags(), "read every node of this lab instead of one agent")
	cmd.Flags().BoolVarP(&f.follow, "follow", "f", false, "keep streaming new verdicts")
	cmd.Flags().StringVarP(&f.output, "output", "o", "", "output format: json, yaml, wide, or empty for a table")
	cmd.Flags().StringVarP(&f.namespace, "namespace", "n", "", "only flows of pods in this namespace")
	cmd.Flags().StringVar(&f.pod, "pod", "", "only flows of this pod (name, or namespace/name)")
	cmd.Flags().StringVar(&f.verdict, "verdict", "", "only this verdict: allowed, denied, rejected or forwarded (a flow from outside sent to a backend on another node)")
	cmd.Flags().StringVar(&f.policy, "policy", "", "only flows this policy decided, logged or passed (name, namespace/name or kind/name)")
	cmd.Flags().IntVar(&f.port, "port", 0, "only flows to this destination port")
	cmd.Flags().DurationVar(&f.since, "since", 0, "only flows seen in this last duration (e.g. 5m)")
	cmd.Flags().StringVar(&f.service, "service", "", "only flows whose client named this Service's address (name, or namespace/name)")
	cmd.Flags().StringVarP(&f.selector, "selector", "l", "", "only flows whose peer has these labels (label selector, e.g. app=db)")
	cmd.Flags().IntVar(&f.limit, "limit", api.DefaultFlowLimit, fmt.Sprintf("newest matching records per node (at most %d); the agents search their whole store", api.MaxFlowLimit))
	cmd.Flags().StringVar(&f.before, "before", "", "only records last seen before this RFC 3339 time: the next older page")
	cmd.Flags().BoolVar(&f.http, "http", false, "only requests L7 policy judged, in a table of requests")
	cmd.Flags().StringVar(&f.method, "method", "", "only requests with this method (implies --http)")
	cmd.Flags().StringVar(&f.path, "path", "", "only requests whose path is this or under it, e.g. /v1 (implies --http)")
	cmd.Flags().IntVar(&f.status, "status", 0, "only records with this status: the server's answers' (e.g. 200, 503), or Weir's in the server's place, 403 (denied) or 400 (refused) (implies --http)")
	return cmd
}

func (f *observeFlags) validate() error {
	switch f.output {
	case "", "json", "yaml", "wide":
	default:
		return fmt.Errorf("--output %q: want json, yaml, wide or empty", f.output)
	}
	if f.since < 0 {
		return fmt.Errorf("--since %v: want a positive duration such as 10m", f.since)
	}
	if f.limit < 1 {
		return fmt.Errorf("--limit %d: want 1 to %d", f.limit, api.MaxFlowLimit)
	}
	f.http = f.http || f.method != "" || f.path != "" || f.status != 0
	q := api.FlowsQuery{Follow: f.follow, Limit: f.limit, FlowFilter: api.FlowFilter{
		Namespace: f.namespace, Pod: f.pod, Verdict: f.verdict, Policy: f.policy, Port: f.port, Selector: f.selector, Service: f.service,
		HTTP: f.http, Method: f.method, Path: f.path, Status: f.status}}
	if f.since > 0 {
		q.Since = time.Now().Add(-f.since)
	}
	if f.before != "" {
		t, err := time.Parse(time.RFC3339Nano, f.before)
		if err != nil {
			return fmt.Errorf("--before %q: want an RFC 3339 time such as 2026-11-25T09:00:00Z: %w", f.before, err)
		}
		q.Before = t
	}
	if err := q.Validate(); err != nil {
		return fmt.Errorf("%w (check --verdict, --port, --limit, --selector, --status, --path)", err)
	}
	f.query = q
	return nil
}

// tableFormat is the output format, with the requests' own table for
// --http when no other format was asked for.
func (f *observeFlags) tableFormat() string {
	if f.http && f.output == "" {
		return "http"
	}
	return f.output
}

// lastSeen is when an aggregate last saw its flow, or a flow's time.
func lastSeen(fl api.Flow) time.Time { return api.LastSeen(fl) }

func runObserve(ctx context.Context, f *observeFlags, agents []agentConn, out io.Writer) error {
	if err := f.validate(); err != nil {
		return err
	}
	var (
		mu    sync.Mutex
		flows []api.Flow
	)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	header := false
	var show func(api.Flow) error
	type page struct {
		n      int
		oldest time.Time
	}
	perNode := map[string]*page{}
	emit := func(node string) func(api.Flow) error {
		return func(fl api.Flow) error {
			mu.Lock()
			defer mu.Unlock()
			p := perNode[node]
			if p == nil {
				p = &page{oldest: lastSeen(fl)}
				perNode[node] = p
			}
			p.n++
			if t := lastSeen(fl); t.Before(p.oldest) {
				p.oldest = t
			}
			return show(fl)
		}
	}
	show = func(fl api.Flow) error {
		if !f.follow {
			flows = append(flows, fl) // sorted across nodes below
			return nil
		}
		if !header {
			printFlowHeader(tw, f.tableFormat())
			header = true
		}
		printFlow(tw, out, fl, f.tableFormat())
		return tw.Flush()
	}
	var (
		wg   sync.WaitGroup
		errs = make([]error, 0, len(agents))
	)
	for _, a := range agents {
		if a.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", a.label(), a.err))
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := a.client.Flows(ctx, f.query, emit(a.node))
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", a.label(), err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if !f.follow {
		sort.SliceStable(flows, func(i, j int) bool { return flows[i].Time.Before(flows[j].Time) })
		if len(flows) > 0 {
			printFlowHeader(tw, f.tableFormat())
		}
		for _, fl := range flows {
			printFlow(tw, out, fl, f.tableFormat())
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for node, p := range perNode {
			if p.n >= f.limit {
				fmt.Fprintf(errOut(out), "node %s may hold older matching records: add --before %s for the next page (or raise --limit)\n",
					orLocal(node), p.oldest.UTC().Format(time.RFC3339Nano))
			}
		}
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

func printFlowHeader(tw io.Writer, output string) {
	switch output {
	case "json", "yaml":
	case "http":
		fmt.Fprintln(tw, "TIME\tCOUNT\tVERDICT\tSTATUS\tLATENCY\tPOD\tPEER\tREQUEST\tRULE")
	case "wide":
		fmt.Fprintln(tw, "TIME\tLAST\tCOUNT\tNODE\tVERDICT\tSTAGE\tDIR\tPOD\tPEER\tPROTO\tSRC\tDST\tSERVICE\tPEER-ID\tPEER-LABELS\tRULE\tLOGGED-BY")
	default:
		fmt.Fprintln(tw, "TIME\tCOUNT\tVERDICT\tDIR\tPOD\tPEER\tDST\tRULE")
	}
}

func printFlow(tw io.Writer, out io.Writer, fl api.Flow, output string) {
	ts := fl.Time.Format("15:04:05.000")
	if output != "json" && output != "yaml" {
		fl.Dst = foldedDst(fl)
	}
	switch output {
	case "json":
		b, _ := json.Marshal(fl)
		fmt.Fprintln(out, string(b))
	case "yaml":
		b, _ := yaml.Marshal(fl)
		fmt.Fprintf(out, "---\n%s", b)
	case "wide":
		logged := ""
		if fl.LoggedBy != nil {
			logged = fl.LoggedBy.Kind + "/" + fl.LoggedBy.Name
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", ts, lastSeen(fl).Format("15:04:05.000"),
			max(fl.Count, 1), fl.Node, fl.Verdict, fl.Stage, fl.Direction, fl.Pod, fl.Peer,
			fl.Proto, fl.Src, fl.Dst, flowService(fl), fl.PeerIdentity, strings.Join(fl.PeerLabels, ","), fl.Rule, logged)
	case "http":
		status := "-"
		if fl.HTTP != nil && fl.HTTP.Status != 0 {
			status = fmt.Sprint(fl.HTTP.Status)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ts, max(fl.Count, 1), fl.Verdict, status, latencyText(fl),
			fl.Pod, fl.Peer, requestText(fl.HTTP), fl.Rule)
	default:
		dst := fl.Dst + "/" + fl.Proto
		if fl.ServiceAddr != "" {
			dst += " via " + flowService(fl)
		}
		if fl.HTTP != nil {
			dst += " " + requestText(fl.HTTP)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", ts, max(fl.Count, 1), fl.Verdict, fl.Direction, fl.Pod, fl.Peer, dst, fl.Rule)
	}
}

// latencyText writes the latency of the server's answers a record
// holds: the mean, and the longest when it stands for more than one;
// "-" when it holds none.
func latencyText(fl api.Flow) string {
	h := fl.HTTP
	if h == nil || (!h.Reply && h.Latency == 0) {
		return "-"
	}
	t := roundLatency(h.Latency).String()
	if fl.Count > 1 {
		t += " (max " + roundLatency(h.LatencyMax).String() + ")"
	}
	return t
}

// roundLatency keeps three significant digits or so: 1.23ms, 456µs.
func roundLatency(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	case d >= time.Microsecond:
		return d.Round(time.Microsecond)
	}
	return d
}

// requestText writes a record's request as "METHOD host target",
// with "..." when the record kept only the target's start, and a record
// of answers as "answer to" its request.
func requestText(h *api.FlowHTTP) string {
	if h == nil {
		return "-"
	}
	t := h.Method
	if h.Reply {
		t = "answer to " + t
	}
	if h.Host != "" {
		t += " " + h.Host
	}
	t += " " + h.Target
	if h.TargetCut {
		t += "..."
	}
	return strings.TrimSpace(t)
}

// flowService names the Service a flow went through: its name and the
// address the client named, "-" for none.
func flowService(fl api.Flow) string {
	if fl.ServiceAddr == "" {
		return "-"
	}
	name := fl.Service
	if name == "" {
		name = "(gone)"
	}
	return name + " (" + fl.ServiceAddr + ")"
}

// foldedDst says what a folded scan record covers in the Dst column.
func foldedDst(fl api.Flow) string {
	switch {
	case fl.PeersFolded > 0:
		return fmt.Sprintf("(%d destinations)", fl.PeersFolded)
	case fl.PortsFolded > 0:
		return fmt.Sprintf("%s:(%d ports)", fl.Dst, fl.PortsFolded)
	}
	return fl.Dst
}

func orLocal(node string) string {
	if node == "" {
		return "(local)"
	}
	return node
}

// errOut is where notes go: stderr when out is stdout, else out.
func errOut(out io.Writer) io.Writer {
	if out == os.Stdout {
		return os.Stderr
	}
	return out
}

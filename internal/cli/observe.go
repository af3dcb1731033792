package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/lab"
)

type observeFlags struct {
	socket    string
	labName   string
	follow    bool
	output    string
	namespace string
	pod       string
	verdict   string
	policy    string
	port      int
	since     time.Duration
	selector  string

	// Parsed from the flags by validate.
	labels labels.Selector
	after  time.Time
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
			"  weir observe --lab weir-lab -l app=frontend -o yaml",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sockets := map[string]string{"": f.socket}
			if f.labName != "" {
				st, err := lab.Load(f.labName)
				if err != nil {
					return err
				}
				sockets = map[string]string{}
				for _, n := range st.Nodes {
					sockets[n.Name] = n.Socket
				}
			}
			return runObserve(cmd.Context(), &f, sockets, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&f.socket, "socket", api.DefaultSocket, "the agent's unix socket")
	cmd.Flags().StringVar(&f.labName, "lab", "", "read every node of this lab instead of one agent")
	cmd.Flags().BoolVarP(&f.follow, "follow", "f", false, "keep streaming new verdicts")
	cmd.Flags().StringVarP(&f.output, "output", "o", "", "output format: json, yaml, wide, or empty for a table")
	cmd.Flags().StringVarP(&f.namespace, "namespace", "n", "", "only flows of pods in this namespace")
	cmd.Flags().StringVar(&f.pod, "pod", "", "only flows of this pod (name, or namespace/name)")
	cmd.Flags().StringVar(&f.verdict, "verdict", "", "only this verdict: allowed, denied or rejected")
	cmd.Flags().StringVar(&f.policy, "policy", "", "only flows this policy decided, logged or passed (name, namespace/name or kind/name)")
	cmd.Flags().IntVar(&f.port, "port", 0, "only flows to this destination port")
	cmd.Flags().DurationVar(&f.since, "since", 0, "only flows seen in this last duration (e.g. 5m)")
	cmd.Flags().StringVarP(&f.selector, "selector", "l", "", "only flows whose peer has these labels (label selector, e.g. app=db)")
	return cmd
}

func (f *observeFlags) validate() error {
	switch f.output {
	case "", "json", "yaml", "wide":
	default:
		return fmt.Errorf("--output %q: want json, yaml, wide or empty", f.output)
	}
	switch f.verdict {
	case "", "allowed", "denied", "rejected":
	default:
		return fmt.Errorf("--verdict %q: want allowed, denied or rejected", f.verdict)
	}
	if f.port < 0 || f.port > 65535 {
		return fmt.Errorf("--port %d: want 1 to 65535", f.port)
	}
	if f.since < 0 {
		return fmt.Errorf("--since %v: want a positive duration such as 10m", f.since)
	}
	if f.since > 0 {
		f.after = time.Now().Add(-f.since)
	}
	sel, err := labels.Parse(f.selector)
	if err != nil {
		return fmt.Errorf("--selector %q: %w", f.selector, err)
	}
	f.labels = sel
	return nil
}

// match reports whether fl passes the filters, on either party.
func (f *observeFlags) match(fl api.Flow) bool {
	if f.verdict != "" && fl.Verdict != f.verdict {
		return false
	}
	if f.port != 0 {
		if _, port, err := net.SplitHostPort(fl.Dst); err != nil || port != strconv.Itoa(f.port) {
			return false
		}
	}
	if !f.after.IsZero() && lastSeen(fl).Before(f.after) {
		return false
	}
	if f.policy != "" && !namesPolicy(f.policy, fl.Decider, fl.LoggedBy, fl.PassedBy) {
		return false
	}
	if f.labels != nil && !f.labels.Empty() && !f.labels.Matches(peerLabels(fl.PeerLabels)) {
		return false
	}
	parties := []string{fl.Pod, fl.Peer}
	if f.namespace != "" && !anyHasPrefix(parties, f.namespace+"/") {
		return false
	}
	if f.pod != "" {
		ok := false
		for _, p := range parties {
			ok = ok || p == f.pod || strings.HasSuffix(p, "/"+f.pod)
		}
		return ok
	}
	return true
}

// lastSeen is when an aggregate last saw its flow, or a flow's time.
func lastSeen(fl api.Flow) time.Time {
	if fl.LastTime.After(fl.Time) {
		return fl.LastTime
	}
	return fl.Time
}

// namesPolicy reports whether one of the rules belongs to the policy
// named by want: its name, namespace/name, or kind/name.
func namesPolicy(want string, rules ...*api.FlowRule) bool {
	for _, r := range rules {
		if r == nil {
			continue
		}
		if want == r.Name || want == r.Namespace+"/"+r.Name || strings.EqualFold(want, r.Kind+"/"+r.Name) {
			return true
		}
	}
	return false
}

// peerLabels turns identity labels ("k8s:app=db", "ns:team=a") into the
// pod's own labels for a selector; namespace labels stay prefixed.
func peerLabels(ids []string) labels.Set {
	out := labels.Set{}
	for _, l := range ids {
		k, v, _ := strings.Cut(l, "=")
		out[strings.TrimPrefix(k, "k8s:")] = v
	}
	return out
}

func anyHasPrefix(ss []string, prefix string) bool {
	for _, s := range ss {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

func runObserve(ctx context.Context, f *observeFlags, sockets map[string]string, out io.Writer) error {
	if err := f.validate(); err != nil {
		return err
	}
	var (
		mu    sync.Mutex
		flows []api.Flow
	)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	header := false
	emit := func(fl api.Flow) error {
		mu.Lock()
		defer mu.Unlock()
		if !f.match(fl) {
			return nil
		}
		if !f.follow {
			flows = append(flows, fl) // sorted across nodes below
			return nil
		}
		if !header {
			printFlowHeader(tw, f.output)
			header = true
		}
		printFlow(tw, out, fl, f.output)
		return tw.Flush()
	}
	var (
		wg   sync.WaitGroup
		errs = make([]error, 0, len(sockets))
	)
	for node, sock := range sockets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := api.NewClient(sock).Flows(ctx, api.FlowsQuery{Follow: f.follow}, emit)
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("node %s: %w", node, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if !f.follow {
		sort.SliceStable(flows, func(i, j int) bool { return flows[i].Time.Before(flows[j].Time) })
		if len(flows) > 0 {
			printFlowHeader(tw, f.output)
		}
		for _, fl := range flows {
			printFlow(tw, out, fl, f.output)
		}
		if err := tw.Flush(); err != nil {
			return err
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
	case "wide":
		fmt.Fprintln(tw, "TIME\tLAST\tCOUNT\tNODE\tVERDICT\tSTAGE\tDIR\tPOD\tPEER\tPROTO\tSRC\tDST\tPEER-ID\tPEER-LABELS\tRULE\tLOGGED-BY")
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
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", ts, lastSeen(fl).Format("15:04:05.000"),
			max(fl.Count, 1), fl.Node, fl.Verdict, fl.Stage, fl.Direction, fl.Pod, fl.Peer,
			fl.Proto, fl.Src, fl.Dst, fl.PeerIdentity, strings.Join(fl.PeerLabels, ","), fl.Rule, logged)
	default:
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s/%s\t%s\n", ts, max(fl.Count, 1), fl.Verdict, fl.Direction, fl.Pod, fl.Peer, fl.Dst, fl.Proto, fl.Rule)
	}
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

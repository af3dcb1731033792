package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/spf13/cobra"

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
}

// NewObserveCommand is `weir observe`: policy verdicts as they happen.
func NewObserveCommand() *cobra.Command {
	f := observeFlags{}
	cmd := &cobra.Command{
		Use:   "observe",
		Short: "Show policy verdicts (drops and new allowed connections) with the pod, peer and rule that decided",
		Example: "  weir observe --lab weir-lab --verdict denied\n" +
			"  weir observe --lab weir-lab -n demo -f -o json",
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
			return runObserve(cmd.Context(), f, sockets, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&f.socket, "socket", api.DefaultSocket, "the agent's unix socket")
	cmd.Flags().StringVar(&f.labName, "lab", "", "read every node of this lab instead of one agent")
	cmd.Flags().BoolVarP(&f.follow, "follow", "f", false, "keep streaming new verdicts")
	cmd.Flags().StringVarP(&f.output, "output", "o", "", "output format: json, wide, or empty for a table")
	cmd.Flags().StringVarP(&f.namespace, "namespace", "n", "", "only flows of pods in this namespace")
	cmd.Flags().StringVar(&f.pod, "pod", "", "only flows of this pod (name, or namespace/name)")
	cmd.Flags().StringVar(&f.verdict, "verdict", "", "only this verdict: allowed or denied")
	return cmd
}

func (f observeFlags) validate() error {
	switch f.output {
	case "", "json", "wide":
	default:
		return fmt.Errorf("--output %q: want json, wide or empty", f.output)
	}
	switch f.verdict {
	case "", "allowed", "denied":
	default:
		return fmt.Errorf("--verdict %q: want allowed or denied", f.verdict)
	}
	return nil
}

// match reports whether fl passes the filters, on either party.
func (f observeFlags) match(fl api.Flow) bool {
	if f.verdict != "" && fl.Verdict != f.verdict {
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

func anyHasPrefix(ss []string, prefix string) bool {
	for _, s := range ss {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

func runObserve(ctx context.Context, f observeFlags, sockets map[string]string, out io.Writer) error {
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
	case "json":
	case "wide":
		fmt.Fprintln(tw, "TIME\tNODE\tVERDICT\tDIR\tPOD\tPEER\tPROTO\tSRC\tDST\tPEER-ID\tPEER-LABELS\tRULE")
	default:
		fmt.Fprintln(tw, "TIME\tVERDICT\tDIR\tPOD\tPEER\tDST\tRULE")
	}
}

func printFlow(tw io.Writer, out io.Writer, fl api.Flow, output string) {
	ts := fl.Time.Format("15:04:05.000")
	switch output {
	case "json":
		b, _ := json.Marshal(fl)
		fmt.Fprintln(out, string(b))
	case "wide":
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", ts, fl.Node, fl.Verdict, fl.Direction, fl.Pod, fl.Peer,
			fl.Proto, fl.Src, fl.Dst, fl.PeerIdentity, strings.Join(fl.PeerLabels, ","), fl.Rule)
	default:
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s/%s\t%s\n", ts, fl.Verdict, fl.Direction, fl.Pod, fl.Peer, fl.Dst, fl.Proto, fl.Rule)
	}
}

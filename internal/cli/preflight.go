package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/weirnet/weir/internal/datapath"
)

// NewPreflightCommand is `weir preflight`: whether this node's kernel has
// what Weir needs.
func NewPreflightCommand() *cobra.Command {
	var output, mode string
	cmd := &cobra.Command{
		Use:   "preflight",
		Short: "Check that this node's kernel has what Weir needs, naming what breaks without each missing feature",
		Long: "Checks, on the node it runs on (as root, as the agent runs): the BPF syscall and JIT, the kernel's BTF, " +
			"conntrack, the BPF filesystem, cgroup v2, that Weir's own eBPF programs pass this kernel's verifier, tcx " +
			"attachment and VXLAN (the last two in a throwaway network namespace). Exits non-zero when a required " +
			"feature is missing.",
		Example: "  sudo weir preflight\n  sudo weir preflight -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			m, err := datapath.ParseMode(mode)
			if err != nil {
				return fmt.Errorf("--mode: %w", err)
			}
			if os.Geteuid() != 0 {
				return errors.New("preflight runs as root, as the agent does: it loads eBPF programs and tries tcx and VXLAN in a throwaway network namespace (sudo weir preflight)")
			}
			return runPreflight(datapath.PreflightChecks(datapath.DefaultPreflightPaths, m), output == "json", cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "json: the results as JSON; empty: a table")
	cmd.Flags().StringVar(&mode, "mode", string(datapath.ModeVXLAN), "the routing mode the node is to run (the chart's routingMode): vxlan needs VXLAN, native does not")
	return cmd
}

// runPreflight runs checks, writes their results and fails when a
// required one failed.
func runPreflight(checks []datapath.Check, asJSON bool, out io.Writer) error {
	results := datapath.RunPreflight(checks)
	var err error
	if asJSON {
		err = writeIndentedJSON(out, results)
	} else {
		err = printPreflight(results, out)
	}
	if err != nil {
		return err
	}
	if err := datapath.PreflightError(results); err != nil {
		return fmt.Errorf("preflight: %w: Weir cannot run on this node until each is there (see above)", err)
	}
	return nil
}

// printPreflight writes one row per check: its result and, for one that
// failed, what went wrong and what breaks without it.
func printPreflight(results []datapath.CheckResult, out io.Writer) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CHECK\tRESULT\tDETAIL")
	for _, r := range results {
		switch {
		case r.OK:
			fmt.Fprintf(w, "%s\tok\t\n", r.Name)
		case r.Required:
			fmt.Fprintf(w, "%s\tMISSING\t%s; needed for %s\n", r.Name, r.Problem, r.Needed)
		default:
			fmt.Fprintf(w, "%s\twarning\t%s; without it: %s\n", r.Name, r.Problem, r.Needed)
		}
	}
	return w.Flush()
}

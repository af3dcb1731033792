package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/weirnet/weir/internal/lab"
)

// newLabConformanceCommand is `weir lab conformance`: the NetworkPolicy
// oracles nobody here wrote, run against a Kubernetes lab.
func newLabConformanceCommand() *cobra.Command {
	var (
		name, results string
		fast          bool
	)
	cmd := &cobra.Command{
		Use:   "conformance [cyclonus|netpol]...",
		Short: "Run cyclonus and the upstream NetworkPolicy e2e suite against the lab (builds both once, then from ~/.cache/weir)",
		Long: "Runs each suite named (default: both) against a running Kubernetes lab and reports passed/total.\n" +
			"cyclonus: every generated case, each probe judged by cyclonus's own matcher.\n" +
			"netpol: k8s.io/kubernetes/test/e2e/network/netpol of the lab's Kubernetes version, per protocol.\n" +
			"--fast runs the CI subsets. Results (JSON, JUnit, logs) go to --results.",
		ValidArgs: []string{lab.SuiteCyclonus, lab.SuiteNetpol},
		Args:      cobra.OnlyValidArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				args = []string{lab.SuiteCyclonus, lab.SuiteNetpol}
			}
			out := cmd.OutOrStdout()
			cyclonus, netpol, err := lab.ConformanceTools(cmd.Context(), out)
			if err != nil {
				return err
			}
			st, err := lab.Load(name)
			if err != nil {
				return err
			}
			if st.Kube == nil {
				return fmt.Errorf("lab %s runs no Kubernetes (it was brought up with --bare)", name)
			}
			var failed bool
			for _, suite := range args {
				var res lab.ConformanceResult
				if suite == lab.SuiteCyclonus {
					res, err = lab.RunCyclonus(cmd.Context(), st, cyclonus, fast, results, out)
				} else {
					res, err = lab.RunNetpolE2E(cmd.Context(), st, netpol, fast, results, out)
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "%s in %.0f s\n", res, res.Seconds)
				for _, f := range res.Failed {
					fmt.Fprintf(out, "  FAILED %s\n", f)
				}
				failed = failed || res.Passed != res.Total
			}
			if failed {
				return fmt.Errorf("conformance failures (details in %s)", results)
			}
			return nil
		},
	}
	wd, _ := os.Getwd()
	cmd.Flags().StringVar(&name, "name", defaultLabName(), "lab name (default: $WEIR_LAB if set)")
	cmd.Flags().BoolVar(&fast, "fast", false, "run the CI subsets only")
	cmd.Flags().StringVar(&results, "results", wd+"/conformance-results", "directory for results")
	return cmd
}

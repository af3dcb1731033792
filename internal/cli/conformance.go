package cli

import (
	"fmt"
	"os"
	"slices"

	"github.com/spf13/cobra"

	"github.com/weirnet/weir/internal/lab"
)

// newLabConformanceCommand is `weir lab conformance`: the NetworkPolicy
// oracles nobody here wrote, run against a Kubernetes lab.
func newLabConformanceCommand() *cobra.Command {
	var (
		name, results string
		fast          bool
		suites        []string
	)
	cmd := &cobra.Command{
		Use:   "conformance [cyclonus|netpol|cnp]...",
		Short: "Run cyclonus and the upstream NetworkPolicy and ClusterNetworkPolicy suites against the lab (builds them once, then from ~/.cache/weir)",
		Long: "Runs each suite named, as arguments or with --suite (default: all three), against a running Kubernetes lab and reports passed/total.\n" +
			"cyclonus: every generated case, each probe judged by cyclonus's own matcher.\n" +
			"netpol: k8s.io/kubernetes/test/e2e/network/netpol of the lab's Kubernetes version, per protocol.\n" +
			"cnp: sigs.k8s.io/network-policy-api's ClusterNetworkPolicy conformance tests (Admin and Baseline tiers),\n" +
			"built from conformance/cnp of the source tree (found from here or from this binary upwards, or at $WEIR_SRC).\n" +
			"--fast runs the CI subsets. Results (JSON, JUnit, logs) go to --results.",
		ValidArgs: []string{lab.SuiteCyclonus, lab.SuiteNetpol, lab.SuiteCNP},
		Args:      cobra.OnlyValidArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			args = append(args, suites...)
			for _, s := range args {
				if s != lab.SuiteCyclonus && s != lab.SuiteNetpol && s != lab.SuiteCNP {
					return fmt.Errorf("unknown suite %q (want %s, %s or %s)", s, lab.SuiteCyclonus, lab.SuiteNetpol, lab.SuiteCNP)
				}
			}
			if len(args) == 0 {
				args = []string{lab.SuiteCyclonus, lab.SuiteNetpol, lab.SuiteCNP}
			}
			out := cmd.OutOrStdout()
			var cyclonus, netpol, cnp string
			var err error
			if slices.Contains(args, lab.SuiteCyclonus) || slices.Contains(args, lab.SuiteNetpol) {
				if cyclonus, netpol, err = lab.ConformanceTools(cmd.Context(), out); err != nil {
					return err
				}
			}
			if slices.Contains(args, lab.SuiteCNP) {
				if cnp, err = lab.CNPSuite(cmd.Context(), out); err != nil {
					return err
				}
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
				switch suite {
				case lab.SuiteCyclonus:
					res, err = lab.RunCyclonus(cmd.Context(), st, cyclonus, fast, results, out)
				case lab.SuiteNetpol:
					res, err = lab.RunNetpolE2E(cmd.Context(), st, netpol, fast, results, out)
				default:
					res, err = lab.RunCNP(cmd.Context(), st, cnp, fast, results, out)
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
	cmd.Flags().StringSliceVar(&suites, "suite", nil, "suite to run (cyclonus, netpol, cnp); repeatable, same as the arguments")
	cmd.Flags().StringVar(&results, "results", wd+"/conformance-results", "directory for results")
	return cmd
}

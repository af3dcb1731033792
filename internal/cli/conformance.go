package cli

import (
	"fmt"
	"os"
	"slices"

	"github.com/spf13/cobra"

	"github.com/weirnet/weir/internal/conformance"
	"github.com/weirnet/weir/internal/lab"
)

// suites are the suites `weir lab conformance` knows, in the order it
// runs them.
var suites = []string{conformance.SuiteCyclonus, conformance.SuiteNetpol, conformance.SuiteCNP, conformance.SuiteServices}

// newLabConformanceCommand is `weir lab conformance`: the oracles nobody
// here wrote, run against a Kubernetes lab.
func newLabConformanceCommand() *cobra.Command {
	var (
		name, results string
		fast          bool
		procs         int
		named         []string
	)
	cmd := &cobra.Command{
		Use:   "conformance [cyclonus|netpol|cnp|services]...",
		Short: "Run cyclonus and the upstream NetworkPolicy, ClusterNetworkPolicy and sig-network (Services) suites against the lab (builds them once, then from ~/.cache/weir)",
		Long: "Runs each suite named, as arguments or with --suite (default: all four), against a running Kubernetes lab and reports passed/total.\n" +
			"cyclonus: every generated case, each probe judged by cyclonus's own matcher.\n" +
			"netpol: k8s.io/kubernetes/test/e2e/network/netpol of the lab's Kubernetes version, per protocol.\n" +
			"cnp: sigs.k8s.io/network-policy-api's ClusterNetworkPolicy conformance tests (Admin and Baseline tiers),\n" +
			"built from conformance/cnp of the source tree (found from here or from this binary upwards, or at $WEIR_SRC).\n" +
			"services: k8s.io/kubernetes/test/e2e/network of the lab's Kubernetes version (Services, Networking, Conntrack,\n" +
			"EndpointSlice, DNS, ...) without its NetworkPolicy specs, in --procs parallel ginkgo processes; bring the lab up\n" +
			"with --kube-proxy none to judge Weir's replacement, or with kube-proxy to compare. Specs this lab cannot host are\n" +
			"skipped, each group with its reason in the result.\n" +
			"--fast runs the CI subsets. Results (JSON, JUnit, logs) go to --results.",
		ValidArgs: suites,
		Args:      cobra.OnlyValidArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			args = append(args, named...)
			for _, s := range args {
				if !slices.Contains(suites, s) {
					return fmt.Errorf("unknown suite %q (want one of %v)", s, suites)
				}
			}
			if len(args) == 0 {
				args = suites
			}
			if procs < 1 {
				return fmt.Errorf("--procs %d: want at least 1", procs)
			}
			out := cmd.OutOrStdout()
			st, err := lab.Load(name)
			if err != nil {
				return err
			}
			if st.Kube == nil {
				return fmt.Errorf("lab %s runs no Kubernetes (it was brought up with --bare)", name)
			}
			var failed bool
			for _, suite := range suites {
				if !slices.Contains(args, suite) {
					continue
				}
				res, err := runSuite(cmd, suite, st, fast, procs, results)
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
	cmd.Flags().IntVar(&procs, "procs", 4, "parallel ginkgo processes for the services suite")
	cmd.Flags().StringSliceVar(&named, "suite", nil, "suite to run (cyclonus, netpol, cnp, services); repeatable, same as the arguments")
	cmd.Flags().StringVar(&results, "results", wd+"/conformance-results", "directory for results")
	return cmd
}

// runSuite builds (or finds in the cache) one suite and runs it.
func runSuite(cmd *cobra.Command, suite string, st *lab.State, fast bool, procs int, results string) (conformance.Result, error) {
	ctx, out := cmd.Context(), cmd.OutOrStdout()
	switch suite {
	case conformance.SuiteCyclonus:
		bin, err := conformance.CyclonusTool(ctx, out)
		if err != nil {
			return conformance.Result{}, err
		}
		return conformance.RunCyclonus(ctx, st, bin, fast, results, out)
	case conformance.SuiteNetpol:
		bin, err := conformance.NetpolSuite(ctx, out)
		if err != nil {
			return conformance.Result{}, err
		}
		return conformance.RunNetpolE2E(ctx, st, bin, fast, results, out)
	case conformance.SuiteCNP:
		bin, err := conformance.CNPSuite(ctx, out)
		if err != nil {
			return conformance.Result{}, err
		}
		return conformance.RunCNP(ctx, st, bin, fast, results, out)
	default:
		tools, err := conformance.ServicesSuite(ctx, out)
		if err != nil {
			return conformance.Result{}, err
		}
		return conformance.RunServices(ctx, st, tools, fast, procs, results, out)
	}
}

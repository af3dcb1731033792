package conformance

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/weirnet/weir/internal/lab"
)

// Conformance suites.
const (
	SuiteCyclonus = "cyclonus"
	SuiteNetpol   = "netpol"
	SuiteCNP      = "cnp"      // sigs.k8s.io/network-policy-api's ClusterNetworkPolicy suite
	SuiteServices = "services" // k8s.io/kubernetes/test/e2e/network without NetworkPolicy
)

// Result is the outcome of one conformance run.
type Result struct {
	Suite  string   `json:"suite"`
	Fast   bool     `json:"fast"` // the CI subset, not every case
	Passed int      `json:"passed"`
	Total  int      `json:"total"`
	Failed []string `json:"failed,omitempty"`
	// ByProtocol splits the upstream suite's specs (TCP, UDP, SCTP, API).
	ByProtocol map[string]*PassCount `json:"byProtocol,omitempty"`
	// ByTier splits the ClusterNetworkPolicy suite's tests (Admin, Baseline).
	ByTier map[string]*PassCount `json:"byTier,omitempty"`
	// ByArea splits the sig-network suite's specs (Services, Networking,
	// DNS, Conntrack, ...).
	ByArea map[string]*PassCount `json:"byArea,omitempty"`
	// KubeProxy is the lab's Service proxy during the run: "none" when
	// Weir replaced kube-proxy, else kube-proxy's mode.
	KubeProxy string `json:"kubeProxy,omitempty"`
	// Subtests counts the subtests of the tests counted in Passed and Total.
	Subtests *PassCount `json:"subtests,omitempty"`
	// NotRunnable names what was not run and why.
	NotRunnable map[string]string `json:"notRunnable,omitempty"`
	// Command is the suite's own command line, with this machine's home
	// and results directory written as ~ and $RESULTS.
	Command string  `json:"command"`
	Seconds float64 `json:"seconds"`
	// JUnit is the JUnit file's name in the results directory.
	JUnit string `json:"junit"`
	// Rerun is the weir command that runs this suite again, every
	// option spelled out; Commit is the source tree's commit (with
	// "-dirty" for uncommitted changes) when the run began.
	Rerun  string `json:"rerun"`
	Commit string `json:"commit,omitempty"`
	// Restarts says why the suite's own process was started again after
	// it crashed before judging every case (each with the evidence
	// gathered), one entry per restart.
	Restarts []string `json:"restarts,omitempty"`
}

// count adds one case that ran, named name, to r and to group's key
// (a protocol, tier or area), failed or passed.
func (r *Result) count(group map[string]*PassCount, key, name string, failed bool) {
	pc := group[key]
	if pc == nil {
		pc = &PassCount{}
		group[key] = pc
	}
	r.Total++
	pc.Total++
	if failed {
		r.Failed = append(r.Failed, name)
		return
	}
	r.Passed++
	pc.Passed++
}

// PassCount is passed out of total.
type PassCount struct {
	Passed int `json:"passed"`
	Total  int `json:"total"`
}

func (r Result) String() string {
	s := fmt.Sprintf("%s: %d/%d passed", r.Suite, r.Passed, r.Total)
	if r.Fast {
		s += " (fast subset)"
	}
	keys := make([]string, 0, len(r.ByProtocol))
	for k := range r.ByProtocol {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		s += fmt.Sprintf("; %s %d/%d", k, r.ByProtocol[k].Passed, r.ByProtocol[k].Total)
	}
	for _, k := range passCountKeys(r.ByTier) {
		s += fmt.Sprintf("; %s tier %d/%d", k, r.ByTier[k].Passed, r.ByTier[k].Total)
	}
	for _, k := range passCountKeys(r.ByArea) {
		s += fmt.Sprintf("; %s %d/%d", k, r.ByArea[k].Passed, r.ByArea[k].Total)
	}
	if r.KubeProxy != "" {
		s += "; kube-proxy: " + r.KubeProxy
	}
	if r.Subtests != nil {
		s += fmt.Sprintf("; subtests %d/%d", r.Subtests.Passed, r.Subtests.Total)
	}
	for k, why := range r.NotRunnable {
		s += fmt.Sprintf("; %s not runnable: %s", k, why)
	}
	for _, why := range r.Restarts {
		s += "; restarted: " + why
	}
	return s
}

type junitCase struct {
	name            string
	failed, skipped bool
	message         string // why it was skipped
}

// readJUnit reads the test cases of a JUnit XML report.
func readJUnit(path string) ([]junitCase, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read JUnit report: %w", err)
	}
	type testcase struct {
		Name    string    `xml:"name,attr"`
		Failure *struct{} `xml:"failure"`
		Error   *struct{} `xml:"error"`
		Skipped *struct {
			Message string `xml:"message,attr"`
		} `xml:"skipped"`
	}
	type suite struct {
		Cases []testcase `xml:"testcase"`
	}
	var doc struct {
		XMLName xml.Name
		Suites  []suite    `xml:"testsuite"`
		Cases   []testcase `xml:"testcase"` // a bare <testsuite> root
	}
	if err := xml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("parse JUnit report %s: %w", path, err)
	}
	all := doc.Cases
	for _, s := range doc.Suites {
		all = append(all, s.Cases...)
	}
	out := make([]junitCase, 0, len(all))
	for _, c := range all {
		jc := junitCase{name: c.Name, failed: c.Failure != nil || c.Error != nil, skipped: c.Skipped != nil}
		if c.Skipped != nil {
			jc.message = c.Skipped.Message
		}
		out = append(out, jc)
	}
	return out, nil
}

func writeResult(dir string, r Result) error {
	r.Command = portablePaths(r.Command, dir)
	for _, path := range []string{r.JUnit, filepath.Join(dir, r.Suite+".log")} {
		if b, err := os.ReadFile(path); err == nil {
			if err := os.WriteFile(path, []byte(portablePaths(string(b), dir)), 0o644); err != nil {
				return fmt.Errorf("write %s: %w", path, err)
			}
		}
	}
	r.JUnit = filepath.Base(r.JUnit)
	if r.Rerun == "" {
		r.Rerun = fmt.Sprintf("weir lab conformance --suite %s --fast=%t --results RESULTS_DIR", r.Suite, r.Fast)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, r.Suite+".json"), append(b, '\n'), 0o644)
}

// objectNames lists the cluster's objects of a resource, as kubectl names
// them (namespace/x, clusternetworkpolicy.policy.networking.k8s.io/y).
func objectNames(ctx context.Context, st *lab.State, resource string) (map[string]bool, error) {
	b, err := st.Kubectl(ctx, nil, "get", resource, "-o", "name")
	if err != nil {
		return nil, fmt.Errorf("list %s: %w: %s", resource, err, b)
	}
	out := map[string]bool{}
	for _, n := range strings.Fields(string(b)) {
		out[n] = true
	}
	return out, nil
}

// namespaces lists the cluster's namespaces.
func namespaces(ctx context.Context, st *lab.State) (map[string]bool, error) {
	return objectNames(ctx, st, "namespaces")
}

// deleteSince deletes every object of resource a suite made and left (it
// deletes its own unless interrupted) and waits up to timeout until they
// are gone, so the cluster is left as the suite found it: a namespace's
// terminating pods still hold their addresses.
func deleteSince(ctx context.Context, st *lab.State, resource string, before map[string]bool, timeout string) error {
	now, err := objectNames(ctx, st, resource)
	if err != nil {
		return err
	}
	args := []string{"delete", "--ignore-not-found", "--wait=true", "--timeout=" + timeout}
	n := len(args)
	for name := range now {
		if !before[name] {
			args = append(args, name)
		}
	}
	if len(args) == n {
		return nil
	}
	if b, err := st.Kubectl(ctx, nil, args...); err != nil {
		return fmt.Errorf("remove what the suite left %v: %w: %s", args[n:], err, b)
	}
	return nil
}

// removeNamespacesSince deletes every namespace a suite made.
func removeNamespacesSince(ctx context.Context, st *lab.State, before map[string]bool) error {
	return deleteSince(ctx, st, "namespaces", before, "180s")
}

// portablePaths writes the machine's home and the results directory of s
// as ~ and $RESULTS, so a committed result names no local path.
func portablePaths(s, resultsDir string) string {
	if resultsDir != "" {
		s = strings.ReplaceAll(s, resultsDir, "$RESULTS")
	}
	if home, err := os.UserHomeDir(); err == nil && home != "/" {
		s = strings.ReplaceAll(s, home+"/", "~/")
	}
	if wd, err := os.Getwd(); err == nil && wd != "/" {
		s = strings.ReplaceAll(s, wd, ".") // the source tree, e.g. a JUnit package attribute
	}
	return s
}

// sourceCommit is the commit of the source tree the run came from (found
// as conformance/cnp is); empty when there is no tree or git.
func sourceCommit() string {
	dir, err := cnpSourceDir()
	if err != nil {
		return ""
	}
	return lab.GitCommit(filepath.Dir(filepath.Dir(dir)))
}

// e2eSuiteMain is the test main of an upstream Kubernetes e2e suite with
// the specs of one package linked in: test/e2e/e2e_test.go's flag
// handling, and a test that runs them under title.
func e2eSuiteMain(specs, title string) string {
	return `package suite_test

import (
	"flag"
	"os"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "` + specs + `"
)

func TestMain(m *testing.M) {
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestSuite(t *testing.T) {
	gomega.RegisterFailHandler(framework.Fail)
	suite, reporter := framework.CreateGinkgoConfig()
	ginkgo.RunSpecs(t, ` + strconv.Quote(title) + `, suite, reporter)
}
`
}

// e2eSuiteBuild builds e2eSuiteMain against the lab's Kubernetes version
// (static, so it runs anywhere) into a test binary named name.
func e2eSuiteBuild(name, specs, title string) lab.GoBuild {
	b := lab.KubernetesBuild()
	b.Name, b.Pkgs, b.Main, b.Test, b.LDFlags = name, []string{"."}, e2eSuiteMain(specs, title), true, ""
	b.Env = []string{"CGO_ENABLED=0"}
	return b
}

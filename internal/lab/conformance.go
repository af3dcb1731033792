package lab

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// CyclonusVersion is the release of github.com/mattfenwick/cyclonus whose
// generated cases and in-memory matcher judge the lab's NetworkPolicy.
const CyclonusVersion = "v0.5.6"

// cyclonusAgnhostImage is the agnhost name cyclonus's server pods ask for;
// the lab's agnhost image carries it as a second tag.
const cyclonusAgnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.43"

// Conformance suites.
const (
	SuiteCyclonus = "cyclonus"
	SuiteNetpol   = "netpol"
	SuiteCNP      = "cnp" // sigs.k8s.io/network-policy-api's ClusterNetworkPolicy suite
)

// ConformanceResult is the outcome of one conformance run.
type ConformanceResult struct {
	Suite  string   `json:"suite"`
	Fast   bool     `json:"fast"` // the CI subset, not every case
	Passed int      `json:"passed"`
	Total  int      `json:"total"`
	Failed []string `json:"failed,omitempty"`
	// ByProtocol splits the upstream suite's specs (TCP, UDP, SCTP, API).
	ByProtocol map[string]*PassCount `json:"byProtocol,omitempty"`
	// ByTier splits the ClusterNetworkPolicy suite's tests (Admin, Baseline).
	ByTier map[string]*PassCount `json:"byTier,omitempty"`
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
}

// PassCount is passed out of total.
type PassCount struct {
	Passed int `json:"passed"`
	Total  int `json:"total"`
}

func (r ConformanceResult) String() string {
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
	if r.Subtests != nil {
		s += fmt.Sprintf("; subtests %d/%d", r.Subtests.Passed, r.Subtests.Total)
	}
	for k, why := range r.NotRunnable {
		s += fmt.Sprintf("; %s not runnable: %s", k, why)
	}
	return s
}

// cyclonusBuild is cyclonus built against the client libraries of the
// lab's Kubernetes version.
func cyclonusBuild() goBuild {
	staging := "v0." + strings.TrimPrefix(KubernetesVersion, "v1.")
	replace := map[string]string{}
	for _, m := range []string{"api", "apimachinery", "client-go"} {
		replace["k8s.io/"+m] = "k8s.io/" + m + "@" + staging
	}
	mod := "github.com/mattfenwick/cyclonus"
	return goBuild{
		Name: "cyclonus", Module: mod, Version: CyclonusVersion, Pkgs: []string{mod + "/cmd/cyclonus"},
		Replace: replace, Env: []string{"CGO_ENABLED=0"}, LDFlags: "-s -w",
	}
}

// netpolSuiteSource is the test main of the upstream NetworkPolicy suite:
// test/e2e/e2e_test.go's flag handling, with only the netpol specs linked in.
const netpolSuiteSource = `package netpol_test

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
	_ "k8s.io/kubernetes/test/e2e/network/netpol"
)

func TestMain(m *testing.M) {
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestNetpol(t *testing.T) {
	gomega.RegisterFailHandler(framework.Fail)
	suite, reporter := framework.CreateGinkgoConfig()
	ginkgo.RunSpecs(t, "NetworkPolicy e2e", suite, reporter)
}
`

// netpolBuild is the upstream NetworkPolicy e2e suite of the lab's
// Kubernetes version, as a test binary.
func netpolBuild() goBuild {
	b := kubernetesBuild()
	b.Name, b.Pkgs, b.Main, b.Test, b.LDFlags = "netpol-e2e", []string{"."}, netpolSuiteSource, true, ""
	b.Env = []string{"CGO_ENABLED=0"}
	return b
}

// ConformanceTools builds (once, then from the cache) cyclonus and the
// upstream NetworkPolicy suite.
func ConformanceTools(ctx context.Context, progress io.Writer) (cyclonus, netpol string, _ error) {
	dir, err := cyclonusBuild().run(ctx, progress)
	if err != nil {
		return "", "", err
	}
	cyclonus = filepath.Join(dir, "cyclonus")
	if dir, err = netpolBuild().run(ctx, progress); err != nil {
		return "", "", err
	}
	return cyclonus, filepath.Join(dir, "netpol-e2e"), nil
}

// cyclonusFastTags are the CI subset (17 cases, 27 steps, multi-peer
// cases excluded): the cases cyclonus derives from the upstream suite and
// every ipBlock case.
var cyclonusFastTags = []string{"upstream-e2e", "peer-ipblock"}

// cyclonusNamespaces are the namespaces cyclonus makes and reuses.
var cyclonusNamespaces = []string{"x", "y", "z", "y-2", "w"}

// RunCyclonus runs cyclonus's generated cases against the lab: every one
// (about 230), or the fast subset.
func RunCyclonus(ctx context.Context, st *State, bin string, fast bool, resultsDir string, out io.Writer) (_ ConformanceResult, retErr error) {
	res := ConformanceResult{Suite: SuiteCyclonus, Fast: fast, JUnit: filepath.Join(resultsDir, "cyclonus-junit.xml"), Commit: sourceCommit()}
	if err := os.MkdirAll(resultsDir, 0o755); err != nil {
		return res, err
	}
	// Left-over namespaces from an earlier run hold pods with stale labels.
	args := append([]string{"delete", "namespace", "--ignore-not-found", "--wait=true", "--timeout=120s"}, cyclonusNamespaces...)
	if b, err := st.Kubectl(ctx, nil, args...); err != nil {
		return res, fmt.Errorf("remove cyclonus namespaces: %w: %s", err, b)
	}
	cmdArgs := []string{"generate",
		"--ignore-loopback",         // a pod reaching itself never crosses the datapath
		"--server-protocol=tcp,udp", // SCTP: this kernel has no SCTP module
		// A denied probe waits out this timeout and cyclonus runs only
		// 15 probes at once, so it sets the pace of a run; 1 s, as the
		// upstream suite uses, is ample for a connection on one machine
		// (a late one is probed again: --retries defaults to 1).
		"--job-timeout-seconds=1",
		"--perturbation-wait-seconds=2",
		// Probe pod addresses. By service name (the default) a probe from
		// a pod whose egress is denied waits out DNS (about 40 s) before
		// its own 2 s timeout, which makes a full run take hours; by
		// service IP, cyclonus v0.5.6 loses the address of a pod whose
		// labels a step changes (Pod.SetLabels does not copy ServiceIP) and
		// probes ":80", the client itself. Services are covered by the
		// upstream suite, which probes ClusterIPs.
		"--destination-type=pod-ip",
		"--pod-creation-timeout-seconds=180",
		"--junit-results-file=" + res.JUnit,
	}
	if fast {
		cmdArgs = append(cmdArgs, "--include="+strings.Join(cyclonusFastTags, ","), "--exclude=multi-peer")
	} else {
		cmdArgs = append(cmdArgs, "--exclude=")
	}
	before, err := st.namespaces(ctx)
	if err != nil {
		return res, err
	}
	defer func() { retErr = errors.Join(retErr, st.removeNamespacesSince(ctx, before)) }()
	res.Command = "KUBECONFIG=" + st.Kube.Kubeconfig + " " + bin + " " + strings.Join(cmdArgs, " ")
	fmt.Fprintf(out, "running: %s\n", res.Command)
	start := time.Now()
	cmd := exec.CommandContext(ctx, bin, cmdArgs...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+st.Kube.Kubeconfig)
	log, err := os.Create(filepath.Join(resultsDir, "cyclonus.log"))
	if err != nil {
		return res, err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	// cyclonus exits 0 with failed cases; the JUnit file is the verdict.
	runErr := cmd.Run()
	res.Seconds = time.Since(start).Seconds()
	cases, err := readJUnit(res.JUnit)
	if err != nil {
		return res, fmt.Errorf("cyclonus (%v, log %s): %w", runErr, log.Name(), err)
	}
	for _, c := range cases {
		res.Total++
		if c.failed {
			res.Failed = append(res.Failed, c.name)
		} else {
			res.Passed++
		}
	}
	if res.Total == 0 {
		return res, fmt.Errorf("cyclonus ran no case (%v); see %s", runErr, log.Name())
	}
	return res, writeResult(resultsDir, res)
}

// netpolFastFocus is the CI subset of the upstream suite: default deny,
// pod and namespace selectors, named ports both ways, a policy update,
// ipBlock except, and UDP.
var netpolFastFocus = []string{
	`should support a 'default-deny-all' policy`,
	`should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector`,
	`should enforce policy based on PodSelector and NamespaceSelector`,
	`should allow ingress access on one named port`,
	`should allow egress access on one named port`,
	`should enforce updated policy`,
	`should enforce except clause while egress access to server in CIDR block`,
	`using UDP should support a 'default-deny-ingress' policy`,
}

// RunNetpolE2E runs the upstream NetworkPolicy suite against the lab.
// SCTP specs are not run: this kernel has no SCTP, so their server pods
// could not even listen.
func RunNetpolE2E(ctx context.Context, st *State, bin string, fast bool, resultsDir string, out io.Writer) (_ ConformanceResult, retErr error) {
	res := ConformanceResult{Suite: SuiteNetpol, Fast: fast, JUnit: filepath.Join(resultsDir, "netpol-junit.xml"), Commit: sourceCommit(),
		NotRunnable: map[string]string{"SCTP": "this kernel has no SCTP module; the 3 [Feature:SCTPConnectivity] specs are skipped"}}
	if err := os.MkdirAll(resultsDir, 0o755); err != nil {
		return res, err
	}
	focus := `\[sig-network\] Netpol`
	if fast {
		quoted := make([]string, len(netpolFastFocus))
		for i, f := range netpolFastFocus {
			quoted[i] = regexp.QuoteMeta(f)
		}
		focus += `.*(` + strings.Join(quoted, "|") + `)`
	}
	args := []string{
		"--kubeconfig=" + st.Kube.Kubeconfig, "--provider=local",
		"--ginkgo.focus=" + focus, `--ginkgo.skip=\[Feature:SCTPConnectivity\]`,
		"--ginkgo.timeout=3h", "--ginkgo.junit-report=" + res.JUnit,
		"--allowed-not-ready-nodes=-1", "--e2e-output-dir=" + resultsDir,
	}
	before, err := st.namespaces(ctx)
	if err != nil {
		return res, err
	}
	defer func() { retErr = errors.Join(retErr, st.removeNamespacesSince(ctx, before)) }()
	res.Command = bin + " '" + strings.Join(args, "' '") + "'"
	fmt.Fprintf(out, "running: %s\n", res.Command)
	start := time.Now()
	cmd := exec.CommandContext(ctx, bin, args...)
	log, err := os.Create(filepath.Join(resultsDir, "netpol.log"))
	if err != nil {
		return res, err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	runErr := cmd.Run() // non-zero on any failed spec; the JUnit file says which
	res.Seconds = time.Since(start).Seconds()
	cases, err := readJUnit(res.JUnit)
	if err != nil {
		return res, fmt.Errorf("netpol e2e (%v, log %s): %w", runErr, log.Name(), err)
	}
	res.ByProtocol = map[string]*PassCount{}
	for _, c := range cases {
		if c.skipped || !strings.Contains(c.name, "Netpol") {
			continue
		}
		proto := netpolProtocol(c.name)
		pc := res.ByProtocol[proto]
		if pc == nil {
			pc = &PassCount{}
			res.ByProtocol[proto] = pc
		}
		res.Total++
		pc.Total++
		if c.failed {
			res.Failed = append(res.Failed, c.name)
		} else {
			res.Passed++
			pc.Passed++
		}
	}
	if res.Total == 0 {
		return res, fmt.Errorf("netpol e2e ran no spec (%v); see %s", runErr, log.Name())
	}
	return res, writeResult(resultsDir, res)
}

func netpolProtocol(spec string) string {
	switch {
	case strings.Contains(spec, "using UDP"):
		return "UDP"
	case strings.Contains(spec, "using SCTP"):
		return "SCTP"
	case strings.Contains(spec, "Netpol API"):
		return "API"
	}
	return "TCP"
}

type junitCase struct {
	name            string
	failed, skipped bool
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
		Skipped *struct{} `xml:"skipped"`
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
		out = append(out, junitCase{name: c.Name, failed: c.Failure != nil || c.Error != nil, skipped: c.Skipped != nil})
	}
	return out, nil
}

func writeResult(dir string, r ConformanceResult) error {
	r.Command = portablePaths(r.Command, dir)
	for _, path := range []string{r.JUnit, filepath.Join(dir, r.Suite+".log")} {
		if b, err := os.ReadFile(path); err == nil {
			if err := os.WriteFile(path, []byte(portablePaths(string(b), dir)), 0o644); err != nil {
				return fmt.Errorf("write %s: %w", path, err)
			}
		}
	}
	r.JUnit = filepath.Base(r.JUnit)
	r.Rerun = fmt.Sprintf("weir lab conformance --suite %s --fast=%t --results RESULTS_DIR", r.Suite, r.Fast)
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, r.Suite+".json"), append(b, '\n'), 0o644)
}

// namespaces lists the cluster's namespaces by name.
func (st *State) namespaces(ctx context.Context) (map[string]bool, error) {
	b, err := st.Kubectl(ctx, nil, "get", "namespaces", "-o", "name")
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w: %s", err, b)
	}
	out := map[string]bool{}
	for _, n := range strings.Fields(string(b)) {
		out[strings.TrimPrefix(n, "namespace/")] = true
	}
	return out, nil
}

// removeNamespacesSince deletes every namespace a suite made and waits
// until they and their pods are gone, so the cluster is left as the
// suite found it (a terminating pod still holds its address).
func (st *State) removeNamespacesSince(ctx context.Context, before map[string]bool) error {
	now, err := st.namespaces(ctx)
	if err != nil {
		return err
	}
	args := []string{"delete", "namespace", "--ignore-not-found", "--wait=true", "--timeout=180s"}
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
		return fmt.Errorf("remove the suite's namespaces %v: %w: %s", args[n:], err, b)
	}
	return nil
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
	return GitCommit(filepath.Dir(filepath.Dir(dir)))
}

// GitCommit is the commit checked out in the git tree at root, "-dirty"
// appended when tracked files outside the excluded paths (relative to
// root) have uncommitted changes; empty when there is no tree or git.
func GitCommit(root string, exclude ...string) string {
	head, err := exec.Command("git", "-C", root, "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return ""
	}
	commit := strings.TrimSpace(string(head))
	args := []string{"-C", root, "status", "--porcelain", "--untracked-files=no", "--", "."}
	for _, e := range exclude {
		args = append(args, ":!"+e)
	}
	if out, err := exec.Command("git", args...).Output(); err == nil && len(out) > 0 {
		commit += "-dirty"
	}
	return commit
}

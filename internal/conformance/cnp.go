package conformance

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
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

	"github.com/weirnet/weir/internal/lab"
)

// The upstream ClusterNetworkPolicy suite (sigs.k8s.io/network-policy-api
// conformance) runs from a test binary built out of the nested module
// conformance/cnp of Weir's source tree, which keeps the suite's client
// libraries out of Weir's own go.mod.

// cnpModuleDir is the nested module, relative to the source tree's root.
const cnpModuleDir = "conformance/cnp"

// cnpFeatures are the suite features Weir claims: the standard
// ClusterNetworkPolicy profile and named ports. Egress node peers are not
// claimed; the suite skips their tests.
var cnpFeatures = []string{"ClusterNetworkPolicy", "ClusterNetworkPolicyNamedPorts"}

// cnpSCTPTests probe SCTP in every subtest, which this kernel cannot do
// (no SCTP module), so they are not run: the SCTP tests of both tiers, and
// the mixed-protocol and inline-CIDR tests, whose every subtest also pokes
// an SCTP port.
var cnpSCTPTests = []string{
	"CNPAdminTierEgressSCTP", "CNPAdminTierIngressSCTP", "CNPAdminTierGress", "CNPAdminTierEgressInlineCIDRPeers",
	"CNPBaselineTierEgressSCTP", "CNPBaselineTierIngressSCTP", "CNPBaselineTierGress", "CNPBaselineTierEgressInlineCIDRPeers",
}

// cnpFastTests are the CI subset: an Admin Deny over a NetworkPolicy and
// Pass down to NetworkPolicy and to the Baseline tier (Integration),
// priorities between Admin policies, Accept/Deny/Pass rule order on egress,
// the Baseline tier on ingress, UDP, and a named port. (Egress to CIDRs
// is only tested together with SCTP upstream; see cnpSCTPTests.)
var cnpFastTests = []string{
	"CNPAdminTierIntegration",
	"CNPAdminTierPriorityField",
	"CNPAdminTierEgressTCP",
	"CNPBaselineTierIngressTCP",
	"CNPAdminTierIngressUDP",
	"CNPAdminTierEgressNamedPort",
}

// cnpNamespaces are the namespaces of the suite's base manifests.
var cnpNamespaces = []string{
	"network-policy-conformance-gryffindor", "network-policy-conformance-slytherin",
	"network-policy-conformance-hufflepuff", "network-policy-conformance-ravenclaw",
	"network-policy-conformance-forbidden-forrest",
}

const cnpResource = "clusternetworkpolicies.policy.networking.k8s.io"

// cnpTestMain is the test function of conformance/cnp.
const cnpTestMain = "TestConformance"

// CNPSuite builds (once per content of conformance/cnp, then from the
// cache) the upstream ClusterNetworkPolicy suite's test binary and returns
// its path. The source tree is found from the working directory or the
// running binary upwards, or at $WEIR_SRC.
func CNPSuite(ctx context.Context, progress io.Writer) (string, error) {
	src, err := cnpSourceDir()
	if err != nil {
		return "", err
	}
	version, key, err := cnpSourceKey(src)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(lab.CacheDir(), "cnp-conformance@"+version+"-"+key)
	bin := filepath.Join(dir, "cnp-conformance.test")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if progress != nil {
		fmt.Fprintf(progress, "building the ClusterNetworkPolicy suite (network-policy-api %s) from %s into %s (first time only)\n", version, src, dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	start := time.Now()
	tmp := bin + ".tmp"
	cmd := exec.CommandContext(ctx, "go", "test", "-c", "-trimpath", "-o", tmp, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("build the ClusterNetworkPolicy suite in %s: %w\n%s", src, err, out)
	}
	if progress != nil {
		fmt.Fprintf(progress, "  cnp-conformance: built in %s\n", time.Since(start).Round(time.Second))
	}
	return bin, os.Rename(tmp, bin)
}

// cnpSourceDir finds conformance/cnp in Weir's source tree.
func cnpSourceDir() (string, error) {
	var starts []string
	if d := os.Getenv("WEIR_SRC"); d != "" {
		starts = append(starts, d)
	}
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		starts = append(starts, filepath.Dir(exe))
	}
	for _, s := range starts {
		for d := s; ; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, cnpModuleDir, "go.mod")); err == nil {
				return filepath.Join(d, cnpModuleDir), nil
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	return "", fmt.Errorf("no %s/go.mod above %v: run from Weir's source tree or set WEIR_SRC", cnpModuleDir, starts)
}

var networkPolicyAPIRequire = regexp.MustCompile(`(?m)^\s*(?:require\s+)?sigs\.k8s\.io/network-policy-api\s+(v\S+)`)

// cnpSourceKey returns the network-policy-api version conformance/cnp
// requires and a hash of its go.mod, go.sum and Go files: the binary is
// rebuilt when any of them changes.
func cnpSourceKey(src string) (version, key string, _ error) {
	mod, err := os.ReadFile(filepath.Join(src, "go.mod"))
	if err != nil {
		return "", "", err
	}
	m := networkPolicyAPIRequire.FindSubmatch(mod)
	if m == nil {
		return "", "", fmt.Errorf("%s/go.mod requires no sigs.k8s.io/network-policy-api", src)
	}
	files, err := filepath.Glob(filepath.Join(src, "*.go"))
	if err != nil {
		return "", "", err
	}
	files = append(files, filepath.Join(src, "go.mod"), filepath.Join(src, "go.sum"))
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", "", err
		}
		fmt.Fprintf(h, "%s %d\n", filepath.Base(f), len(b))
		h.Write(b)
	}
	return string(m[1]), hex.EncodeToString(h.Sum(nil))[:12], nil
}

// RunCNP runs the upstream ClusterNetworkPolicy suite against the lab:
// every test of the Admin and Baseline tiers this kernel can run, or the
// fast subset. A test counts once, passed only if all its subtests pass;
// Failed names the failing subtests.
func RunCNP(ctx context.Context, st *lab.State, bin string, fast bool, resultsDir string, out io.Writer) (_ Result, retErr error) {
	res := Result{Suite: SuiteCNP, Fast: fast, JUnit: filepath.Join(resultsDir, "cnp-junit.xml"), Commit: sourceCommit(),
		NotRunnable: map[string]string{"SCTP": fmt.Sprintf("this kernel has no SCTP module: the base manifests' SCTP servers are left out "+
			"and the %d tests that probe SCTP in every subtest are not run (%s)", len(cnpSCTPTests), strings.Join(cnpSCTPTests, ", "))}}
	if err := os.MkdirAll(resultsDir, 0o755); err != nil {
		return res, err
	}
	if _, err := st.Kubectl(ctx, nil, "get", "crd", cnpResource); err != nil {
		return res, fmt.Errorf("the lab has no ClusterNetworkPolicy API: %w", err)
	}
	// Left-over namespaces from an interrupted run hold pods of an older
	// image or manifest.
	args := append([]string{"delete", "namespace", "--ignore-not-found", "--wait=true", "--timeout=180s"}, cnpNamespaces...)
	if _, err := st.Kubectl(ctx, nil, args...); err != nil {
		return res, fmt.Errorf("remove the suite's namespaces: %w", err)
	}
	nsBefore, err := namespaces(ctx, st)
	if err != nil {
		return res, err
	}
	cnpBefore, err := objectNames(ctx, st, cnpResource)
	if err != nil {
		return res, err
	}
	defer func() {
		retErr = errors.Join(retErr, deleteSince(ctx, st, cnpResource, cnpBefore, "60s"), removeNamespacesSince(ctx, st, nsBefore))
	}()

	run := "^" + cnpTestMain + "$"
	if fast {
		run += "/^(" + strings.Join(cnpFastTests, "|") + ")$"
	}
	cmdArgs := []string{
		"-test.v", "-test.count=1", "-test.timeout=3h",
		"-test.run=" + run,
		"-test.skip=^" + cnpTestMain + "$/^(" + strings.Join(cnpSCTPTests, "|") + ")$",
		"-kubeconfig=" + st.Kube.Kubeconfig,
		"-supported-features=" + strings.Join(cnpFeatures, ","),
	}
	res.Command = bin + " '" + strings.Join(cmdArgs, "' '") + "'"
	fmt.Fprintf(out, "running: %s\n", res.Command)
	logPath := filepath.Join(resultsDir, "cnp.log")
	log, err := os.Create(logPath)
	if err != nil {
		return res, err
	}
	defer log.Close()
	start := time.Now()
	cmd := exec.CommandContext(ctx, bin, cmdArgs...)
	cmd.Stdout, cmd.Stderr = log, log
	runErr := cmd.Run() // non-zero on any failure; the verdict lines say which
	res.Seconds = time.Since(start).Seconds()
	if _, err := log.Seek(0, io.SeekStart); err != nil {
		return res, err
	}
	verdicts, err := readGoTestVerdicts(log)
	if err != nil {
		return res, fmt.Errorf("read %s: %w", logPath, err)
	}
	skipped := tallyCNP(&res, verdicts)
	if len(skipped) > 0 {
		res.NotRunnable["unclaimed features"] = fmt.Sprintf("skipped by the suite (Weir claims %s): %s",
			strings.Join(cnpFeatures, ", "), strings.Join(skipped, ", "))
	}
	if err := writeGoTestJUnit(res.JUnit, SuiteCNP, verdicts); err != nil {
		return res, err
	}
	if res.Total == 0 {
		return res, fmt.Errorf("the ClusterNetworkPolicy suite ran no test (%v); see %s", runErr, logPath)
	}
	return res, writeResult(resultsDir, res)
}

// tallyCNP counts the suite's tests (the subtests of TestConformance) into
// res, and their subtests into res.Subtests and returns the skipped tests.
func tallyCNP(res *Result, verdicts []goTestVerdict) (skipped []string) {
	res.Subtests = &PassCount{}
	res.ByTier = map[string]*PassCount{}
	prefix := cnpTestMain + "/"
	failedSub := map[string]bool{} // tests with a failed subtest
	for _, v := range verdicts {
		name, ok := strings.CutPrefix(v.name, prefix)
		if !ok || v.result == "SKIP" {
			continue
		}
		test, _, isSub := strings.Cut(name, "/")
		if !isSub {
			continue
		}
		res.Subtests.Total++
		if v.result == "PASS" {
			res.Subtests.Passed++
		} else {
			res.Failed = append(res.Failed, name)
			failedSub[test] = true
		}
	}
	for _, v := range verdicts {
		name, ok := strings.CutPrefix(v.name, prefix)
		if !ok || strings.Contains(name, "/") {
			continue
		}
		if v.result == "SKIP" {
			skipped = append(skipped, name)
			continue
		}
		tier := cnpTier(name)
		pc := res.ByTier[tier]
		if pc == nil {
			pc = &PassCount{}
			res.ByTier[tier] = pc
		}
		res.Total++
		pc.Total++
		switch {
		case v.result == "PASS":
			res.Passed++
			pc.Passed++
		case !failedSub[name]: // failed outside its subtests: applying its manifests
			res.Failed = append(res.Failed, name)
		}
	}
	return skipped
}

// cnpTier is the tier a test of the suite is about, from its name.
func cnpTier(test string) string {
	switch {
	case strings.HasPrefix(test, "CNPAdminTier"):
		return "Admin"
	case strings.HasPrefix(test, "CNPBaselineTier"):
		return "Baseline"
	}
	return "other"
}

// goTestVerdict is one `--- PASS/FAIL/SKIP: name (time)` line of `go test -v`.
type goTestVerdict struct {
	name, result string
	seconds      string
}

var goTestVerdictLine = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): (\S+) \(([0-9.]+)s\)`)

// readGoTestVerdicts reads the verdict of every test and subtest from the
// output of a test binary run with -test.v.
func readGoTestVerdicts(r io.Reader) ([]goTestVerdict, error) {
	var out []goTestVerdict
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		if m := goTestVerdictLine.FindStringSubmatch(sc.Text()); m != nil {
			out = append(out, goTestVerdict{name: m[2], result: m[1], seconds: m[3]})
		}
	}
	return out, sc.Err()
}

// writeGoTestJUnit writes the verdicts as a JUnit report, one test case per
// test or subtest that has no subtests of its own.
func writeGoTestJUnit(path, suite string, verdicts []goTestVerdict) error {
	type result struct{}
	type testcase struct {
		Class   string  `xml:"classname,attr"`
		Name    string  `xml:"name,attr"`
		Time    string  `xml:"time,attr"`
		Failure *result `xml:"failure"`
		Skipped *result `xml:"skipped"`
	}
	type testsuite struct {
		XMLName  xml.Name   `xml:"testsuite"`
		Name     string     `xml:"name,attr"`
		Tests    int        `xml:"tests,attr"`
		Failures int        `xml:"failures,attr"`
		Skipped  int        `xml:"skipped,attr"`
		Cases    []testcase `xml:"testcase"`
	}
	parent := map[string]bool{}
	for _, v := range verdicts {
		if i := strings.LastIndex(v.name, "/"); i >= 0 {
			parent[v.name[:i]] = true
		}
	}
	doc := testsuite{Name: suite}
	for _, v := range verdicts {
		if parent[v.name] {
			continue
		}
		c := testcase{Class: v.name, Name: v.name, Time: v.seconds}
		if i := strings.LastIndex(v.name, "/"); i >= 0 {
			c.Class, c.Name = v.name[:i], v.name[i+1:]
		}
		switch v.result {
		case "FAIL":
			c.Failure = &result{}
			doc.Failures++
		case "SKIP":
			c.Skipped = &result{}
			doc.Skipped++
		}
		doc.Tests++
		doc.Cases = append(doc.Cases, c)
	}
	b, err := xml.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append([]byte(xml.Header), append(b, '\n')...), 0o644)
}

func passCountKeys(m map[string]*PassCount) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

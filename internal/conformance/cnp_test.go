package conformance

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// cnpLog is `-test.v` output of the suite's test binary, abridged.
const cnpLog = `=== RUN   TestConformance
    conformance_test.go:63: base manifests: ...
=== RUN   TestConformance/CNPAdminTierEgressTCP
=== RUN   TestConformance/CNPAdminTierEgressTCP/Should_support_an_'allow-egress'_policy
=== RUN   TestConformance/CNPAdminTierEgressTCP/Should_support_a_'deny-egress'_policy
        helper.go:85: Expected connection to fail ...
=== RUN   TestConformance/CNPAdminTierEgressNodePeers
    suite.go:196: Skipping CNPAdminTierEgressNodePeers: suite does not support ClusterNetworkPolicyEgressNodePeers
=== RUN   TestConformance/CNPBaselineTierIngressUDP
--- FAIL: TestConformance (95.20s)
    --- FAIL: TestConformance/CNPAdminTierEgressTCP (30.50s)
        --- PASS: TestConformance/CNPAdminTierEgressTCP/Should_support_an_'allow-egress'_policy (3.01s)
        --- FAIL: TestConformance/CNPAdminTierEgressTCP/Should_support_a_'deny-egress'_policy (10.52s)
    --- SKIP: TestConformance/CNPAdminTierEgressNodePeers (0.00s)
    --- PASS: TestConformance/CNPAdminTierPriorityField (12.00s)
        --- PASS: TestConformance/CNPAdminTierPriorityField/Should_Deny (4.00s)
    --- FAIL: TestConformance/CNPBaselineTierIngressUDP (1.00s)
FAIL
`

func TestTallyCNP(t *testing.T) {
	verdicts, err := readGoTestVerdicts(strings.NewReader(cnpLog))
	if err != nil {
		t.Fatal(err)
	}
	if len(verdicts) != 8 {
		t.Fatalf("%d verdicts, want 8: %v", len(verdicts), verdicts)
	}
	var res Result
	skipped := tallyCNP(&res, verdicts)
	if res.Passed != 1 || res.Total != 3 {
		t.Errorf("tests %d/%d, want 1/3", res.Passed, res.Total)
	}
	if *res.Subtests != (PassCount{Passed: 2, Total: 3}) {
		t.Errorf("subtests %+v, want 2/3", *res.Subtests)
	}
	if *res.ByTier["Admin"] != (PassCount{Passed: 1, Total: 2}) || *res.ByTier["Baseline"] != (PassCount{Passed: 0, Total: 1}) {
		t.Errorf("by tier: Admin %+v, Baseline %+v", *res.ByTier["Admin"], *res.ByTier["Baseline"])
	}
	wantFailed := []string{
		"CNPAdminTierEgressTCP/Should_support_a_'deny-egress'_policy",
		"CNPBaselineTierIngressUDP", // no subtest failed: it failed applying its manifests
	}
	if !reflect.DeepEqual(res.Failed, wantFailed) {
		t.Errorf("failed %q, want %q", res.Failed, wantFailed)
	}
	if !reflect.DeepEqual(skipped, []string{"CNPAdminTierEgressNodePeers"}) {
		t.Errorf("skipped %q", skipped)
	}
	if s := res.String(); !strings.Contains(s, "Admin tier 1/2; Baseline tier 0/1; subtests 2/3") {
		t.Errorf("String() = %q", s)
	}
}

func TestWriteGoTestJUnit(t *testing.T) {
	verdicts, err := readGoTestVerdicts(strings.NewReader(cnpLog))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "junit.xml")
	if err := writeGoTestJUnit(path, SuiteCNP, verdicts); err != nil {
		t.Fatal(err)
	}
	cases, err := readJUnit(path)
	if err != nil {
		t.Fatal(err)
	}
	// Leaves only: the three subtests, the skipped test and the test that
	// failed without subtests.
	want := []junitCase{
		{name: "Should_support_an_'allow-egress'_policy"},
		{name: "Should_support_a_'deny-egress'_policy", failed: true},
		{name: "CNPAdminTierEgressNodePeers", skipped: true},
		{name: "Should_Deny"},
		{name: "CNPBaselineTierIngressUDP", failed: true},
	}
	if !reflect.DeepEqual(cases, want) {
		t.Errorf("JUnit cases %+v, want %+v", cases, want)
	}
}

func TestCNPSourceKey(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module x\n\ngo 1.26\n\nrequire (\n\tgithub.com/a/b v1.0.0\n\tsigs.k8s.io/network-policy-api v0.2.0\n)\n")
	write("go.sum", "")
	write("a_test.go", "package x\n")
	version, key, err := cnpSourceKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if version != "v0.2.0" {
		t.Errorf("version %q, want v0.2.0", version)
	}
	write("a_test.go", "package x // changed\n")
	if _, key2, _ := cnpSourceKey(dir); key2 == key {
		t.Error("key unchanged after a source change")
	}
	write("go.mod", "module x\n")
	if _, _, err := cnpSourceKey(dir); err == nil {
		t.Error("no error for a go.mod without network-policy-api")
	}
}

// The nested module is found from anywhere in the source tree, and its
// go.mod requires the suite.
func TestCNPSourceDir(t *testing.T) {
	dir, err := cnpSourceDir()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := cnpSourceKey(dir); err != nil {
		t.Fatal(err)
	}
}

// TestWriteResultNamesNoLocalPath: a result written for committing names
// neither this machine's home nor its results directory, in the JSON or
// the JUnit file, and says how to run it again.
func TestWriteResultNamesNoLocalPath(t *testing.T) {
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	junit := filepath.Join(dir, "netpol-junit.xml")
	if err := os.WriteFile(junit, []byte(`<testsuite package="`+dir+`/x"></testsuite>`), 0o644); err != nil {
		t.Fatal(err)
	}
	r := Result{Suite: SuiteNetpol, Fast: true, JUnit: junit,
		Command: home + "/.cache/weir/netpol-e2e/netpol-e2e '--ginkgo.junit-report=" + junit + "'"}
	if err := writeResult(dir, r); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"netpol.json", "netpol-junit.xml"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), home+"/") || strings.Contains(string(b), dir) {
			t.Errorf("%s names a local path:\n%s", name, b)
		}
	}
	b, _ := os.ReadFile(filepath.Join(dir, "netpol.json"))
	if !strings.Contains(string(b), `"rerun": "weir lab conformance --suite netpol --fast=true --results RESULTS_DIR"`) {
		t.Errorf("no rerun command:\n%s", b)
	}
}

package conformance

import (
	"go/parser"
	"go/token"
	"reflect"
	"regexp"
	"strconv"
	"testing"

	"github.com/weirnet/weir/internal/lab"
)

// TestTallyServicesCountsAreasAndNamesWhatDidNotRun: specs that ran count
// per area, the lab's skips count per group with their reason, and a spec
// the suite skipped by itself is named with its message.
func TestTallyServicesCountsAreasAndNamesWhatDidNotRun(t *testing.T) {
	cases := []junitCase{
		{name: "[It] [sig-network] Services should serve a basic endpoint from pods [Conformance] [sig-network, Conformance]"},
		{name: "[It] [sig-network] Services should be rejected when no endpoints exist [sig-network]", failed: true},
		{name: "[It] [sig-network] Networking Granular Checks: Services should function for pod-Service: udp [sig-network]"},
		{name: "[It] [sig-network] [Feature:IPv6DualStack] should create pod, add ipv6 and ipv4 ip to pod ips [sig-network, Feature:IPv6DualStack]", skipped: true, message: "skipped"},
		{name: "[It] [sig-network] Services should allow creating a basic SCTP service with pod and endpoints [LinuxOnly] [Serial] [sig-network, Serial]", skipped: true, message: "skipped"},
		{name: "[It] [sig-network] Services should work with ESIPP [sig-network]", skipped: true, message: "skipped - Only supported for providers [gce gke] (not local)"},
		{name: "[It] [sig-network] Services should be updated after adding or deleting ports [sig-network]", skipped: true, message: "skipped"},
		{name: "[It] [sig-storage] something else entirely"},
		{name: "[SynchronizedBeforeSuite]"},
	}
	res := Result{NotRunnable: map[string]string{}}
	if n := tallyServices(&res, cases, false); n != 1 {
		t.Errorf("%d specs skipped themselves, want 1", n)
	}
	if res.Passed != 2 || res.Total != 3 {
		t.Errorf("passed/total = %d/%d, want 2/3", res.Passed, res.Total)
	}
	wantAreas := map[string]*PassCount{"Services": {Passed: 1, Total: 2}, "Networking": {Passed: 1, Total: 1}}
	if !reflect.DeepEqual(res.ByArea, wantAreas) {
		t.Errorf("areas = %v, want %v", res.ByArea, wantAreas)
	}
	if want := []string{"[sig-network] Services should be rejected when no endpoints exist"}; !reflect.DeepEqual(res.Failed, want) {
		t.Errorf("failed = %q, want %q", res.Failed, want)
	}
	for _, key := range []string{"IPv6 (1 specs)", "SCTP (1 specs)", "skipped by the suite itself (1 specs)"} {
		if res.NotRunnable[key] == "" {
			t.Errorf("not runnable lacks %q: %v", key, res.NotRunnable)
		}
	}
	if got := res.NotRunnable["skipped by the suite itself (1 specs)"]; got != "[sig-network] Services should work with ESIPP: Only supported for providers [gce gke] (not local)" {
		t.Errorf("the suite's own skip lost its message: %q", got)
	}
}

// TestServicesFastSubsetIsRunnable: every CI spec is a Service spec none
// of the lab's skips removes.
func TestServicesFastSubsetIsRunnable(t *testing.T) {
	for _, f := range servicesFastFocus {
		spec := "[It] [sig-network] " + f + " [sig-network]"
		if g := notRunnableGroup(spec); g != nil {
			t.Errorf("fast spec %q is skipped as %s", f, g.Name)
		}
	}
	for _, n := range servicesNotRunnable {
		if _, err := regexp.Compile(n.Pattern); err != nil {
			t.Errorf("%s: %v", n.Name, err)
		}
		if n.Why == "" {
			t.Errorf("%s: no reason", n.Name)
		}
	}
}

func TestSpecArea(t *testing.T) {
	for name, want := range map[string]string{
		"[It] [sig-network] Services should x [sig-network]":                                              "Services",
		"[It] [sig-network] [Feature:IPv6DualStack] Granular Checks: x [sig-network]":                     "Granular",
		"[It] [sig-network] Conntrack should be able to preserve UDP traffic [sig-network]":               "Conntrack",
		"[It] [sig-network] DNS should provide DNS for services [Conformance] [sig-network, Conformance]": "DNS",
	} {
		if got := specArea(name); got != want {
			t.Errorf("specArea(%q) = %q, want %q", name, got, want)
		}
	}
}

// TestE2ESuiteMainLinksItsSpecs: the generated test main of each upstream
// suite is Go that links in that suite's specs, and each build writes the
// binary its runner looks for.
func TestE2ESuiteMainLinksItsSpecs(t *testing.T) {
	for _, tt := range []struct {
		build      lab.GoBuild
		name, spec string
	}{
		{netpolBuild(), "netpol-e2e", "k8s.io/kubernetes/test/e2e/network/netpol"},
		{sigNetworkBuild(), sigNetworkBinary, "k8s.io/kubernetes/test/e2e/network"},
	} {
		if tt.build.Name != tt.name || !tt.build.Test || tt.build.Version != lab.KubernetesVersion {
			t.Errorf("build %s (test %t, %s), want test binary %s of Kubernetes %s", tt.build.Name, tt.build.Test, tt.build.Version, tt.name, lab.KubernetesVersion)
		}
		f, err := parser.ParseFile(token.NewFileSet(), "main_test.go", tt.build.Main, 0)
		if err != nil {
			t.Fatalf("%s: generated main does not parse: %v", tt.name, err)
		}
		var linked bool
		for _, imp := range f.Imports {
			linked = linked || (imp.Path.Value == strconv.Quote(tt.spec) && imp.Name != nil && imp.Name.Name == "_")
		}
		if !linked {
			t.Errorf("%s: main does not link in %s", tt.name, tt.spec)
		}
	}
}

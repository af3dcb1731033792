package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/weirnet/weir/internal/lab"
)

// The upstream sig-network suite (k8s.io/kubernetes/test/e2e/network of
// the lab's Kubernetes version: Services, Networking's granular checks,
// conntrack, EndpointSlices, DNS, ...) judges Weir's Service datapath, run
// on a lab without kube-proxy. Its NetworkPolicy specs are the netpol
// suite's; what this lab cannot host is skipped, each with its reason.

// sigNetworkBinary is the suite's test binary; ginkgo's CLI runs a
// precompiled suite only when its name ends in .test.
const sigNetworkBinary = "sig-network-e2e.test"

// sigNetworkBuild is the suite with the sig-network specs linked in.
func sigNetworkBuild() lab.GoBuild {
	return e2eSuiteBuild(sigNetworkBinary, "k8s.io/kubernetes/test/e2e/network", "sig-network e2e")
}

// ginkgoVersion is the ginkgo the lab's Kubernetes version requires; its
// CLI runs the suite's specs in parallel processes, as upstream CI does.
const ginkgoVersion = "v2.32.0"

func ginkgoBuild() lab.GoBuild {
	mod := "github.com/onsi/ginkgo/v2"
	return lab.GoBuild{Name: "ginkgo", Module: mod, Version: ginkgoVersion, Pkgs: []string{mod + "/ginkgo"},
		Env: []string{"CGO_ENABLED=0"}, LDFlags: "-s -w"}
}

// SigNetworkTools are the binaries RunServices needs.
type SigNetworkTools struct{ Suite, Ginkgo string }

// ServicesSuite builds (once, then from the cache) the upstream
// sig-network suite and ginkgo's CLI.
func ServicesSuite(ctx context.Context, progress io.Writer) (SigNetworkTools, error) {
	dir, err := sigNetworkBuild().Run(ctx, progress)
	if err != nil {
		return SigNetworkTools{}, err
	}
	gdir, err := ginkgoBuild().Run(ctx, progress)
	if err != nil {
		return SigNetworkTools{}, err
	}
	return SigNetworkTools{Suite: filepath.Join(dir, sigNetworkBinary), Ginkgo: filepath.Join(gdir, "ginkgo")}, nil
}

// notRunnable is a group of specs this lab cannot host (or that belong to
// another suite), matched on the spec's full name, and why.
type notRunnable struct {
	Name, Pattern, Why string
}

// servicesNotRunnable are skipped; every other [sig-network] spec runs.
var servicesNotRunnable = []notRunnable{
	{"NetworkPolicy", `\[Feature:NetworkPolicy\]|Netpol API`,
		"NetworkPolicy specs: run by the netpol suite (weir lab conformance netpol)"},
	{"SCTP", `SCTP`, "this kernel has no SCTP module, so no SCTP socket can even be opened"},
	{"IPv6", `\[Feature:IPv6DualStack\]|\[Feature:Networking-IPv6\]`, "the lab's cluster is single-stack IPv4"},
	{"cloud load balancers", `\[Feature:LoadBalancer\]`,
		"they wait for a cloud provider's controller to provision a load balancer (gce, aws, azure); " +
			"Weir serves the status.loadBalancer.ingress IPs such a controller assigns, which Weir's own e2e tests check"},
	{"Internet", `\[Feature:Networking-IPv4\]|\[Feature:Networking-DNS\]|should forward PTR records lookup to upstream nameserver`,
		"they reach 8.8.8.8 and google.com (the PTR forwarding spec first resolves 8.8.8.8's name, dns.google, " +
			"through the cluster DNS's default upstream); this machine has no Internet"},
	{"provider gce", `\[Provider:gce\]`, "they need GCE's metadata and DNS"},
	{"kube-proxy itself", `\[sig-network\] KubeProxy |should work after restarting kube-proxy|should recreate its iptables rules`,
		"they check kube-proxy's own conntrack sysctls, nfacct counters, iptables rules or restart the kube-proxy process: " +
			"the lab runs no kube-proxy (Weir replaces it)"},
	{"apiserver restart", `should work after restarting apiserver`,
		"it restarts the control plane through the provider's SSH access, which the local provider lacks"},
	{"performance", `\[Feature:PerformanceDNS\]|\[Feature:Networking-Performance\]`,
		"scale and throughput measurements, not pass/fail behaviour (Weir's benchmarks measure these: bench/)"},
}

// servicesFastFocus is the CI subset: ClusterIP and NodePort with their
// endpoints following pods, session affinity, a Service without endpoints
// rejecting, UDP from pods and nodes, and UDP conntrack surviving a
// backend swap.
var servicesFastFocus = []string{
	`Services should serve a basic endpoint from pods`,
	`Services should be able to create a functioning NodePort service`,
	`Services should have session affinity work for service with type clusterIP`,
	`Services should be rejected when no endpoints exist`,
	`Granular Checks: Services should function for pod-Service: udp`,
	`Granular Checks: Services should function for node-Service: http`,
	`Conntrack should be able to preserve UDP traffic when server pod cycles for a ClusterIP service`,
}

// RunServices runs the upstream sig-network suite against the lab: every
// spec it can host, or the fast subset, in parallel ginkgo processes.
func RunServices(ctx context.Context, st *lab.State, tools SigNetworkTools, fast bool, procs int, resultsDir string, out io.Writer) (_ Result, retErr error) {
	res := Result{Suite: SuiteServices, Fast: fast, JUnit: filepath.Join(resultsDir, "services-junit.xml"), Commit: sourceCommit(),
		KubeProxy: st.Config.KubeProxy, NotRunnable: map[string]string{}}
	if procs < 1 {
		return res, fmt.Errorf("procs %d: want at least 1 ginkgo process", procs)
	}
	if err := os.MkdirAll(resultsDir, 0o755); err != nil {
		return res, err
	}
	focus := `\[sig-network\]`
	if fast {
		quoted := make([]string, len(servicesFastFocus))
		for i, f := range servicesFastFocus {
			quoted[i] = regexp.QuoteMeta(f)
		}
		focus += `.*(` + strings.Join(quoted, "|") + `)`
	}
	skips := make([]string, len(servicesNotRunnable))
	for i, n := range servicesNotRunnable {
		skips[i] = n.Pattern
	}
	// ginkgo joins a relative report path to the suite's output
	// directory: an absolute one lands where the result says.
	junit, err := filepath.Abs(res.JUnit)
	if err != nil {
		return res, err
	}
	ginkgoArgs := []string{
		"--procs=" + strconv.Itoa(procs), "--focus=" + focus, "--skip=" + strings.Join(skips, "|"),
		"--timeout=3h", "--junit-report=" + junit, "--no-color",
	}
	suiteArgs := []string{
		"--kubeconfig=" + st.Kube.Kubeconfig, "--provider=local",
		// Specs that need several nodes skip themselves unless told how
		// many there are.
		"--num-nodes=" + strconv.Itoa(len(st.Nodes)),
		"--allowed-not-ready-nodes=-1", "--e2e-output-dir=" + resultsDir,
	}
	args := append(append(append(ginkgoArgs, tools.Suite), "--"), suiteArgs...)
	before, err := namespaces(ctx, st)
	if err != nil {
		return res, err
	}
	defer func() { retErr = errors.Join(retErr, removeNamespacesSince(ctx, st, before)) }()
	res.Command = tools.Ginkgo + " '" + strings.Join(args, "' '") + "'"
	fmt.Fprintf(out, "running: %s\n", res.Command)
	logPath := filepath.Join(resultsDir, "services.log")
	log, err := os.Create(logPath)
	if err != nil {
		return res, err
	}
	defer log.Close()
	start := time.Now()
	cmd := exec.CommandContext(ctx, tools.Ginkgo, args...)
	cmd.Dir = resultsDir // ginkgo writes its per-process reports beside the JUnit file
	cmd.Stdout, cmd.Stderr = log, log
	runErr := cmd.Run() // non-zero on any failed spec; the JUnit file says which
	res.Seconds = time.Since(start).Seconds()
	cases, err := readJUnit(res.JUnit)
	if err != nil {
		return res, fmt.Errorf("sig-network e2e (%v, log %s): %w", runErr, logPath, err)
	}
	selfSkipped := tallyServices(&res, cases, fast)
	res.Rerun = fmt.Sprintf("weir lab up --kube-proxy %s && weir lab conformance --suite %s --fast=%t --procs %d --results RESULTS_DIR",
		st.Config.KubeProxy, SuiteServices, fast, procs)
	if res.Total == 0 {
		return res, fmt.Errorf("sig-network e2e ran no spec (%v); see %s", runErr, logPath)
	}
	if fast && selfSkipped > 0 {
		// The CI subset is chosen to run in this lab: a spec that skips
		// itself there is a lab or runner fault, not a pass.
		return res, fmt.Errorf("%d specs of the CI subset skipped themselves: %v", selfSkipped, res.NotRunnable)
	}
	return res, writeResult(resultsDir, res)
}

// tallyServices counts the specs that ran into res, by area (the first
// words after [sig-network]), names the groups the lab skipped (a full
// run) and every spec that skipped itself at run time with its reason,
// and returns how many did.
func tallyServices(res *Result, cases []junitCase, fast bool) (selfSkipped int) {
	res.ByArea = map[string]*PassCount{}
	notRun := map[string]int{}
	var suiteSkipped []string
	for _, c := range cases {
		if !strings.Contains(c.name, "[sig-network]") {
			continue
		}
		if c.skipped {
			// ginkgo writes "skipped - REASON" for a spec that skipped
			// itself; one its filters left out says just "skipped".
			if _, why, ok := strings.Cut(c.message, " - "); ok {
				suiteSkipped = append(suiteSkipped, specName(c.name)+": "+why)
			} else if g := notRunnableGroup(c.name); g != nil {
				notRun[g.Name]++
			}
			continue
		}
		res.count(res.ByArea, specArea(c.name), specName(c.name), c.failed)
	}
	if !fast {
		for _, g := range servicesNotRunnable {
			if notRun[g.Name] > 0 {
				res.NotRunnable[fmt.Sprintf("%s (%d specs)", g.Name, notRun[g.Name])] = g.Why
			}
		}
	}
	if len(suiteSkipped) > 0 {
		sort.Strings(suiteSkipped)
		res.NotRunnable[fmt.Sprintf("skipped by the suite itself (%d specs)", len(suiteSkipped))] = strings.Join(suiteSkipped, "; ")
	}
	return len(suiteSkipped)
}

func notRunnableGroup(spec string) *notRunnable {
	for i := range servicesNotRunnable {
		if regexp.MustCompile(servicesNotRunnable[i].Pattern).MatchString(spec) {
			return &servicesNotRunnable[i]
		}
	}
	return nil
}

// specName drops ginkgo's "[It] " prefix and the trailing label list.
func specName(name string) string {
	name = strings.TrimPrefix(name, "[It] ")
	if i := strings.LastIndex(name, " [sig-network"); i > 0 && strings.HasSuffix(name, "]") {
		name = name[:i]
	}
	return name
}

// specArea is the spec's area: "Services", "Networking", "DNS", ...,
// the first word after [sig-network] that is not a label.
func specArea(name string) string {
	_, rest, _ := strings.Cut(specName(name), "[sig-network]")
	for _, f := range strings.Fields(rest) {
		if !strings.HasPrefix(f, "[") {
			return f
		}
	}
	return "other"
}

package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/weirnet/weir/internal/lab"
)

// CyclonusVersion is the release of github.com/mattfenwick/cyclonus whose
// generated cases and in-memory matcher judge the lab's NetworkPolicy.
const CyclonusVersion = "v0.5.6"

// cyclonusBuild is cyclonus built against the client libraries of the
// lab's Kubernetes version.
func cyclonusBuild() lab.GoBuild {
	staging := "v0." + strings.TrimPrefix(lab.KubernetesVersion, "v1.")
	replace := map[string]string{}
	for _, m := range []string{"api", "apimachinery", "client-go"} {
		replace["k8s.io/"+m] = "k8s.io/" + m + "@" + staging
	}
	mod := "github.com/mattfenwick/cyclonus"
	return lab.GoBuild{
		Name: "cyclonus", Module: mod, Version: CyclonusVersion, Pkgs: []string{mod + "/cmd/cyclonus"},
		Replace: replace, Env: []string{"CGO_ENABLED=0"}, LDFlags: "-s -w",
	}
}

// CyclonusTool builds (once, then from the cache) cyclonus and returns
// its path.
func CyclonusTool(ctx context.Context, progress io.Writer) (string, error) {
	dir, err := cyclonusBuild().Run(ctx, progress)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "cyclonus"), nil
}

// cyclonusFastTags are the CI subset (17 cases, 27 steps, multi-peer
// cases excluded): the cases cyclonus derives from the upstream suite and
// every ipBlock case.
var cyclonusFastTags = []string{"upstream-e2e", "peer-ipblock"}

// cyclonusNamespaces are the namespaces cyclonus makes and reuses.
var cyclonusNamespaces = []string{"x", "y", "z", "y-2", "w"}

// RunCyclonus runs cyclonus's generated cases against the lab: every one
// (about 230), or the fast subset.
func RunCyclonus(ctx context.Context, st *lab.State, bin string, fast bool, resultsDir string, out io.Writer) (_ Result, retErr error) {
	res := Result{Suite: SuiteCyclonus, Fast: fast, JUnit: filepath.Join(resultsDir, "cyclonus-junit.xml"), Commit: sourceCommit()}
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
	before, err := namespaces(ctx, st)
	if err != nil {
		return res, err
	}
	defer func() { retErr = errors.Join(retErr, removeNamespacesSince(ctx, st, before)) }()
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

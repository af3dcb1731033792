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
	if err := removeCyclonusNamespaces(ctx, st); err != nil {
		return res, err
	}
	cmdArgs := cyclonusArgs(fast, res.JUnit)
	before, err := namespaces(ctx, st)
	if err != nil {
		return res, err
	}
	defer func() { retErr = errors.Join(retErr, removeNamespacesSince(ctx, st, before)) }()
	res.Command = "KUBECONFIG=" + st.Kube.Kubeconfig + " " + bin + " " + strings.Join(cmdArgs, " ")
	logPath := filepath.Join(resultsDir, "cyclonus.log")
	start := time.Now()
	var cases []junitCase
	for attempt := 0; ; attempt++ {
		runErr := runCyclonusOnce(ctx, st.Kube.Kubeconfig, bin, cmdArgs, logPath, out)
		if cases, err = readJUnit(res.JUnit); err == nil {
			break
		}
		err = fmt.Errorf("cyclonus (%v, log %s): %w", runErr, logPath, err)
		pod, conflict := cyclonusUpdateConflict(logPath)
		if !conflict || attempt >= maxCyclonusRestarts {
			return res, err
		}
		why := fmt.Sprintf("cyclonus exited on a conflicting update of pod %s (it reads and writes labels without retrying); the pod's writers: %s",
			pod, podWriters(ctx, st, pod))
		fmt.Fprintln(out, why)
		res.Restarts = append(res.Restarts, why)
		// The failed attempt's log stays beside the next one's.
		if err := os.Rename(logPath, fmt.Sprintf("%s.%d", logPath, attempt+1)); err != nil {
			return res, fmt.Errorf("keep the log of cyclonus's crashed run: %w", err)
		}
		if err := removeCyclonusNamespaces(ctx, st); err != nil {
			return res, err
		}
	}
	res.Seconds = time.Since(start).Seconds()
	for _, c := range cases {
		res.Total++
		if c.failed {
			res.Failed = append(res.Failed, c.name)
		} else {
			res.Passed++
		}
	}
	if res.Total == 0 {
		return res, fmt.Errorf("cyclonus ran no case; see %s", logPath)
	}
	return res, writeResult(resultsDir, res)
}

// maxCyclonusRestarts bounds how often a cyclonus run that crashed on an
// update conflict starts again. Only that crash restarts: it says nothing
// about the datapath, and every case is judged again from the start.
const maxCyclonusRestarts = 1

// cyclonusArgs is cyclonus's command line: every case, or the fast
// subset, with the JUnit report written to junit.
func cyclonusArgs(fast bool, junit string) []string {
	args := []string{"generate",
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
		"--junit-results-file=" + junit,
	}
	if fast {
		return append(args, "--include="+strings.Join(cyclonusFastTags, ","), "--exclude=multi-peer")
	}
	return append(args, "--exclude=")
}

// removeCyclonusNamespaces removes the namespaces an earlier run left:
// their pods hold stale labels.
func removeCyclonusNamespaces(ctx context.Context, st *lab.State) error {
	args := append([]string{"delete", "namespace", "--ignore-not-found", "--wait=true", "--timeout=120s"}, cyclonusNamespaces...)
	if b, err := st.Kubectl(ctx, nil, args...); err != nil {
		return fmt.Errorf("remove cyclonus namespaces: %w: %s", err, b)
	}
	return nil
}

// runCyclonusOnce runs cyclonus with its output in logPath. It returns
// cyclonus's exit error: cyclonus exits 0 with failed cases, so the JUnit
// report, not this, is the verdict.
func runCyclonusOnce(ctx context.Context, kubeconfig, bin string, args []string, logPath string, out io.Writer) error {
	fmt.Fprintf(out, "running: KUBECONFIG=%s %s %s\n", kubeconfig, bin, strings.Join(args, " "))
	log, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	cmd.Stdout, cmd.Stderr = log, log
	return cmd.Run()
}

// cyclonusConflict matches cyclonus's fatal exit when a pod changed
// between its read and its write of the pod's labels.
var cyclonusConflict = regexp.MustCompile(`the object has been modified; please apply your changes to the latest version and try again\\nunable to update pod ([a-z0-9.-]+/[a-z0-9.-]+)`)

// cyclonusUpdateConflict reports whether cyclonus's log ends in that
// exit, and which pod ("namespace/name") it was updating.
func cyclonusUpdateConflict(logPath string) (string, bool) {
	b, err := os.ReadFile(logPath)
	if err != nil {
		return "", false
	}
	m := cyclonusConflict.FindAllSubmatch(b, -1)
	if len(m) == 0 {
		return "", false
	}
	return string(m[len(m)-1][1]), true
}

// podWriters lists who last wrote each part of pod ("namespace/name"),
// from its managed fields, and its containers' restarts: the evidence of
// who raced cyclonus.
func podWriters(ctx context.Context, st *lab.State, pod string) string {
	ns, name, _ := strings.Cut(pod, "/")
	tmpl := `{{range .metadata.managedFields}}{{.manager}} {{.operation}}{{if .subresource}} {{.subresource}}{{end}} at {{.time}}; {{end}}{{range .status.containerStatuses}}container {{.name}} restarted {{.restartCount}} times; {{end}}`
	b, err := st.Kubectl(ctx, nil, "get", "pod", "-n", ns, name, "--show-managed-fields", "-o", "go-template="+tmpl)
	if err != nil {
		return fmt.Sprintf("unknown (%v: %s)", err, strings.TrimSpace(string(b)))
	}
	return strings.TrimSpace(string(b))
}

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

// netpolBuild is the upstream NetworkPolicy e2e suite of the lab's
// Kubernetes version, as a test binary with only the netpol specs linked in.
func netpolBuild() lab.GoBuild {
	return e2eSuiteBuild("netpol-e2e", "k8s.io/kubernetes/test/e2e/network/netpol", "NetworkPolicy e2e")
}

// NetpolSuite builds (once, then from the cache) the upstream
// NetworkPolicy suite and returns its path.
func NetpolSuite(ctx context.Context, progress io.Writer) (string, error) {
	dir, err := netpolBuild().Run(ctx, progress)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "netpol-e2e"), nil
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
func RunNetpolE2E(ctx context.Context, st *lab.State, bin string, fast bool, resultsDir string, out io.Writer) (_ Result, retErr error) {
	res := Result{Suite: SuiteNetpol, Fast: fast, JUnit: filepath.Join(resultsDir, "netpol-junit.xml"), Commit: sourceCommit(),
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
	before, err := namespaces(ctx, st)
	if err != nil {
		return res, err
	}
	defer func() { retErr = errors.Join(retErr, removeNamespacesSince(ctx, st, before)) }()
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
		res.count(res.ByProtocol, netpolProtocol(c.name), c.name, c.failed)
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

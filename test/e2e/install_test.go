package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirnet/weir/internal/cni"
	"github.com/weirnet/weir/internal/lab"
)

// readmeImage is the image repository README's install block names, for
// the operator's registry; the lab's nodes imported theirs instead.
const readmeImage = "registry.example/weir-agent"

// installBlockMarker precedes, in README.md, the block of commands this
// test runs as written.
const installBlockMarker = "<!-- test/e2e/install_test.go runs this block as written -->"

// TestInstallOnYourCluster follows README's "Install on your cluster" on
// a lab that came up without a CNI, as a new user on their own cluster
// would: it runs the README's block of commands (preflight on each node,
// helm install, rollout status, weir status, weir connectivity test,
// weir version) as written, each of which must succeed, and then wants
// the cluster working: every node Ready and CoreDNS serving. Two things
// stand in for the user's cluster: the image repository the nodes
// imported instead of a registry, and the lab's values file (host paths
// apart per node, since the lab's nodes share one file system).
func TestInstallOnYourCluster(t *testing.T) {
	st := newKubeLabConfig(t, lab.Config{CNI: lab.CNINone, KubeProxy: lab.KubeProxyNFTables})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c, err := st.Client()
	if err != nil {
		t.Fatal(err)
	}
	// Nothing of Weir yet: nodes NotReady (no CNI config), no agents.
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if nodeIsReady(n.Status.Conditions) {
			t.Errorf("node %s is Ready before any CNI was installed", n.Name)
		}
	}
	if _, err := c.AppsV1().DaemonSets("kube-system").Get(ctx, "weir-agent", metav1.GetOptions{}); err == nil {
		t.Fatal("the weir-agent DaemonSet exists before helm install")
	}

	// The nodes had another CNI, whose configuration would sort before
	// Weir's: the agents must set it aside, or the runtime keeps using it.
	for _, n := range st.Nodes {
		conf, _ := st.CNIDirs(&n)
		if err := os.MkdirAll(conf, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(conf, previousCNIConf), []byte(previousCNI), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("the chart's manifests pass the API server's strict validation with several value sets", func(t *testing.T) {
		validateChartAgainstCluster(t, st)
	})

	steps := readmeInstallSteps(t)
	env := installEnv(t, st)
	for _, step := range steps {
		for _, run := range installRuns(t, st, step) {
			start := time.Now()
			cmd := exec.CommandContext(ctx, run[0], run[1:]...)
			cmd.Dir, cmd.Env = env.dir, env.vars
			out, err := cmd.CombinedOutput()
			t.Logf("$ %s  (%s)\n%s", step, time.Since(start).Round(100*time.Millisecond), out)
			if err != nil {
				t.Fatalf("README step %q: %v", step, err)
			}
		}
	}

	// The agents run with the four capabilities the chart lists, not
	// privileged, with the machine's cgroup2 that mount-fs mounted.
	for _, n := range st.Nodes {
		pid, err := st.AgentPID(n.Name)
		if err != nil {
			t.Fatal(err)
		}
		if caps, err := effectiveCaps(pid); err != nil || caps != agentCaps {
			t.Errorf("node %s: agent's effective capabilities %#x (%v), want %#x (NET_ADMIN, SYS_ADMIN, PERFMON, BPF)", n.Name, caps, err, agentCaps)
		}
	}

	for _, n := range st.Nodes {
		conf, _ := st.CNIDirs(&n)
		if _, err := os.Stat(filepath.Join(conf, previousCNIConf+cni.SetAsideSuffix)); err != nil {
			t.Errorf("node %s: the previous CNI's config was not set aside: %v", n.Name, err)
		}
	}

	// A working cluster: every node Ready, cluster DNS serving.
	waitFor(t, time.Minute, func() error {
		nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var notReady []string
		for _, n := range nodes.Items {
			if !nodeIsReady(n.Status.Conditions) {
				notReady = append(notReady, n.Name)
			}
		}
		if len(notReady) > 0 {
			return fmt.Errorf("nodes not Ready: %v", notReady)
		}
		return nil
	})
	if err := st.WaitDeployment(ctx, "kube-system", "coredns", 2*time.Minute); err != nil {
		t.Errorf("cluster DNS after installing Weir: %v", err)
	}
}

// previousCNI is the configuration a CNI installed before Weir left on
// the nodes, named to sort before Weir's, its plugin gone.
const (
	previousCNIConf = "00-previous.conflist"
	previousCNI     = `{"cniVersion":"1.0.0","name":"previous","plugins":[{"type":"previous-cni-removed"}]}`
)

// chartValueSets are the value sets whose manifests the cluster
// validates: between them every template and every branch an operator
// picks.
var chartValueSets = [][]string{
	nil,
	{"routingMode=native", "kubeProxyReplacement=true", "k8sServiceHost=10.0.0.1", "k8sServicePort=6443", "metrics.port=0", "mtu=1400"},
	{"agent.privileged=true", "dashboards.enabled=true", "metrics.bindAddress=fd00::1", "agent.extraArgs={--identity-option=false}"},
	{"agent.enabled=false", "upgradeCheck.enabled=false", "rbac.extraGroups={weir:agents}"},
}

// validateChartAgainstCluster renders the chart (CRDs and the upgrade
// hook included) with each value set and has the API server validate
// every object in a dry run, strictly: a field the server's OpenAPI does
// not know, or a value its schema refuses, fails. This is the cluster's
// own schema standing in for an offline validator (none runs here without
// downloading schemas). Nothing is persisted.
func validateChartAgainstCluster(t *testing.T, st *lab.State) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, set := range chartValueSets {
		args := []string{"template", "weir", "../../deploy/helm/weir", "--namespace", "kube-system", "--include-crds"}
		for _, v := range set {
			args = append(args, "--set", v)
		}
		rendered, err := exec.CommandContext(ctx, st.KubeBin("helm"), args...).Output()
		if err != nil {
			t.Fatalf("helm template %v: %v", set, err)
		}
		out, err := st.Kubectl(ctx, strings.NewReader(string(rendered)), "apply", "--dry-run=server", "--validate=strict", "-f", "-")
		if err != nil {
			t.Errorf("values %v: the API server refuses the rendered chart: %v", set, err)
			continue
		}
		t.Logf("values %v: %d objects valid", set, strings.Count(string(out), "(server dry run)"))
	}
}

// readmeInstallSteps returns the commands of README's install block, a
// continued line joined and comments dropped.
func readmeInstallSteps(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), installBlockMarker)
	if !ok {
		t.Fatalf("README.md has no %q: the install block this test runs is gone", installBlockMarker)
	}
	after = strings.TrimLeft(after, "\n")
	if !strings.HasPrefix(after, "```\n") {
		t.Fatalf("README.md: the install marker is not followed by a code block")
	}
	block, _, ok := strings.Cut(strings.TrimPrefix(after, "```\n"), "\n```")
	if !ok {
		t.Fatalf("README.md: the install block does not end")
	}
	var steps []string
	var cur strings.Builder
	sc := bufio.NewScanner(strings.NewReader(block))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		more := strings.HasSuffix(line, `\`)
		cur.WriteString(strings.TrimSpace(strings.TrimSuffix(line, `\`)))
		if more {
			cur.WriteString(" ")
			continue
		}
		steps = append(steps, cur.String())
		cur.Reset()
	}
	if len(steps) < 5 {
		t.Fatalf("README.md's install block has %d commands, want preflight, helm install, rollout status, status, connectivity test: %q", len(steps), steps)
	}
	return steps
}

// installEnvironment is where README's commands run: a directory holding
// bin/ (this run's binaries) and deploy/ (the tree's chart), as in a
// checkout after `make build`, with helm and kubectl on the PATH and the
// lab's kubeconfig in KUBECONFIG.
type installEnvironment struct {
	dir  string
	vars []string
}

func installEnv(t *testing.T, st *lab.State) installEnvironment {
	t.Helper()
	dir := t.TempDir()
	deploy, err := filepath.Abs("../../deploy")
	if err != nil {
		t.Fatal(err)
	}
	tools := filepath.Join(dir, "tools")
	if err := os.Mkdir(tools, 0o755); err != nil {
		t.Fatal(err)
	}
	links := map[string]string{filepath.Join(dir, "bin"): binDir, filepath.Join(dir, "deploy"): deploy}
	for _, tool := range []string{"helm", "kubectl"} {
		links[filepath.Join(tools, tool)] = st.KubeBin(tool)
	}
	for link, target := range links {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	vars := append(os.Environ(), "PATH="+tools+":"+os.Getenv("PATH"), "KUBECONFIG="+st.Kube.Kubeconfig,
		"HELM_CACHE_HOME="+filepath.Join(dir, "helm", "cache"), "HELM_CONFIG_HOME="+filepath.Join(dir, "helm", "config"),
		"HELM_DATA_HOME="+filepath.Join(dir, "helm", "data"))
	return installEnvironment{dir: dir, vars: vars}
}

// installRuns turns one README step into what runs on the lab: a step
// for each node ("sudo", as root already) runs in every node's network
// namespace; helm install gets the image the nodes imported and the
// lab's values file; every other step runs as written.
func installRuns(t *testing.T, st *lab.State, step string) [][]string {
	t.Helper()
	shell := func(s string) []string { return []string{"bash", "-euo", "pipefail", "-c", s} }
	switch {
	case strings.HasPrefix(step, "sudo "):
		var runs [][]string
		for _, n := range st.Nodes {
			runs = append(runs, append([]string{"ip", "netns", "exec", n.NetNS}, shell(strings.TrimPrefix(step, "sudo "))...))
		}
		return runs
	case strings.HasPrefix(step, "helm install "):
		if !strings.Contains(step, readmeImage) {
			t.Fatalf("README's helm install %q does not name the image repository %s", step, readmeImage)
		}
		repo, _, _ := strings.Cut(lab.AgentImage, ":")
		return [][]string{shell(strings.ReplaceAll(step, readmeImage, repo) + " --values " + st.LabValuesFile())}
	default:
		return [][]string{shell(step)}
	}
}

// agentCaps are CAP_NET_ADMIN (12), CAP_SYS_ADMIN (21), CAP_PERFMON (38)
// and CAP_BPF (39).
const agentCaps = 1<<12 | 1<<21 | 1<<38 | 1<<39

// effectiveCaps reads a process's effective capability set.
func effectiveCaps(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("no CapEff in /proc/%d/status", pid)
}

func nodeIsReady(conds []corev1.NodeCondition) bool {
	for _, c := range conds {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

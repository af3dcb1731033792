package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/weirnet/weir/deploy"
)

// HelmRelease is the name the lab installs Weir's chart under, in
// kube-system.
const HelmRelease = "weir"

// InstallWeir installs (or upgrades to) Weir's chart with helm, with the
// lab's values: the CRDs and RBAC always, since agents run as host
// processes need them too, and the agent DaemonSet unless they do. The
// lab does it when it comes up; a test calls it again after uninstalling
// Weir, so the lab's pods can be torn down through their CNI.
func (st *State) InstallWeir(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "weir-chart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	chart, ref := "", AgentImage
	if st.Config.Release != "" {
		r, err := buildRelease(ctx, st.Config.Release, io.Discard)
		if err != nil {
			return err
		}
		chart, ref = r.Chart, r.Ref
	} else if chart, err = deploy.WriteChart(dir); err != nil {
		return err
	}
	file := filepath.Join(dir, "values.yaml")
	if err := st.writeValues(file, ref, chartHasCgroupRoot(chart)); err != nil {
		return err
	}
	_, err = st.Helm(ctx, "upgrade", "--install", HelmRelease, chart, "--namespace", "kube-system", "--values", file)
	return err
}

// LabValuesFile is where a lab without a CNI (CNINone) writes the chart
// values its nodes need, for the operator's `helm install --values`.
func (st *State) LabValuesFile() string { return filepath.Join(st.RunDir, "weir-values.yaml") }

func (st *State) writeLabValues() (string, error) {
	file := st.LabValuesFile()
	return file, st.writeValues(file, AgentImage, true)
}

// chartHasCgroupRoot says whether a chart has agent.paths.cgroupRoot and
// the mount-fs init container that mounts it; an earlier release's chart
// (Config.Release) may not, and refuses values it does not know.
func chartHasCgroupRoot(chart string) bool {
	b, err := os.ReadFile(filepath.Join(chart, "values.yaml"))
	return err == nil && strings.Contains(string(b), "cgroupRoot:")
}

// writeValues writes the lab's chart values for the agent image ref to
// file, headed by why a lab needs them.
func (st *State) writeValues(file, ref string, cgroupRoot bool) error {
	values, err := yaml.Marshal(st.chartValues(ref, cgroupRoot))
	if err != nil {
		return err
	}
	head := "# Chart values for Weir on lab " + st.Config.Name + ": the image every node imported (no registry),\n" +
		"# host paths apart per node (the lab's nodes share one file system), the API server's address.\n"
	return os.WriteFile(file, append([]byte(head), values...), 0o644)
}

// UpgradeWeir upgrades a lab that came up with an earlier release
// (Config.Release) to the tree's chart and image, with helm upgrade, then
// applies the chart's CRDs as README's Upgrade says, and returns when
// both are applied (the agents then roll, node by node).
func (st *State) UpgradeWeir(ctx context.Context) error {
	if st.Config.Release == "" {
		return fmt.Errorf("lab %s runs the tree's Weir already: nothing to upgrade from", st.Config.Name)
	}
	rel := st.Config.Release
	st.Config.Release = ""
	if err := st.InstallWeir(ctx); err != nil {
		st.Config.Release = rel // still installed: helm changed nothing
		return err
	}
	// The tree's chart is installed whether or not its CRDs apply.
	return errors.Join(st.applyChartCRDs(ctx), st.save())
}

// applyChartCRDs applies the tree's chart's CRDs server-side. Helm
// installs a chart's CRDs with the release only, never on upgrade, and an
// agent's caches wait for every kind it watches: one added since the
// release (WeirNetworkPolicy) must be applied for the new agents to follow
// the cluster. Helm's install manages the fields of the CRDs it created,
// so a CRD that changed since (a field added) conflicts with it: the
// chart's CRDs are the ones meant, hence --force-conflicts.
func (st *State) applyChartCRDs(ctx context.Context) error {
	dir := deploy.ChartDir + "/crds"
	files, err := fs.ReadDir(deploy.Chart, dir)
	if err != nil {
		return fmt.Errorf("read the chart's CRDs: %w", err)
	}
	var docs strings.Builder
	for _, f := range files {
		b, err := fs.ReadFile(deploy.Chart, dir+"/"+f.Name())
		if err != nil {
			return fmt.Errorf("read the chart's CRDs: %w", err)
		}
		docs.WriteString("\n---\n") // empty documents are skipped
		docs.Write(b)
	}
	if _, err := st.Kubectl(ctx, strings.NewReader(docs.String()), "apply", "--server-side", "--force-conflicts", "-f", "-"); err != nil {
		return fmt.Errorf("apply the chart's CRDs: %w", err)
	}
	return nil
}

// chartValues are the chart's values for this lab: its image (imported
// into every node, never pulled), mode and CIDR; every host path under the
// lab's run directory and $(NODE_NAME), since the lab's nodes share one
// file system; the API server reached directly, not through a Service.
//
// With cgroupRoot (a chart whose mount-fs init container mounts the
// machine's cgroup2 for an agent that is not privileged), each node's
// cgroup2 goes under its run directory, which the init container mounts
// with Bidirectional propagation so that the mount reaches the agent.
func (st *State) chartValues(image string, cgroupRoot bool) map[string]any {
	repo, tag, _ := strings.Cut(image, ":")
	node := filepath.Join(st.RunDir, "$(NODE_NAME)")
	paths := map[string]any{
		"state": filepath.Join(node, "state"), "socket": filepath.Join(node, "agent.sock"),
		"bpfPin":  filepath.Join(pinRoot(st.Config.Name), "$(NODE_NAME)"),
		"cniConf": filepath.Join(node, "cni", "net.d"), "cniBin": filepath.Join(node, "cni", "bin"),
	}
	labMount := map[string]any{"name": "lab", "path": st.RunDir, "propagation": "HostToContainer"}
	if cgroupRoot {
		paths["cgroupRoot"] = filepath.Join(node, "cgroup2")
		labMount["propagation"] = "Bidirectional"
	}
	return map[string]any{
		"image":                map[string]any{"repository": repo, "tag": tag, "pullPolicy": "Never"},
		"routingMode":          string(st.Config.Mode),
		"clusterCIDR":          st.Config.ClusterCIDR.String(),
		"kubeProxyReplacement": st.replacesKubeProxy(),
		"k8sServiceHost":       controlPlaneIP.String(),
		"k8sServicePort":       strconv.Itoa(apiPort),
		"agent": map[string]any{
			"enabled": st.Config.AgentMode != AgentHost,
			"paths":   paths,
			// Pod network namespaces appear under the run directory after
			// the agent starts. The lab mounted bpffs already.
			"hostMounts": []map[string]any{labMount, {"name": "bpffs", "path": "/sys/fs/bpf"}},
		},
		// The agents run as host processes present client certificates
		// in this group.
		"rbac": map[string]any{"extraGroups": []string{"weir:agents"}},
	}
}

// Helm runs the lab's helm with its admin kubeconfig, keeping helm's own
// cache and configuration in the lab's run directory.
func (st *State) Helm(ctx context.Context, args ...string) ([]byte, error) {
	if st.Kube == nil {
		return nil, fmt.Errorf("lab %s runs no Kubernetes", st.Config.Name)
	}
	cmd := exec.CommandContext(ctx, st.KubeBin("helm"), append(args, "--kubeconfig", st.Kube.Kubeconfig)...)
	home := filepath.Join(st.RunDir, "helm")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

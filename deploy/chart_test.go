package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/weirnet/weir/deploy"
	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/lab"
	"github.com/weirnet/weir/internal/testutil"
	"github.com/weirnet/weir/internal/version"
)

// helm returns the lab's helm (lab.HelmBuild), building it under CI and
// skipping the test elsewhere when it is not built yet (`weir lab build`).
func helm(t *testing.T) string {
	t.Helper()
	b := lab.HelmBuild()
	bin := filepath.Join(lab.CacheDir(), b.Name+"@"+b.Version, "helm")
	if _, err := os.Stat(bin); err != nil && !testutil.InCI() {
		t.Skipf("helm %s is not built: run `bin/weir lab build` (CI builds it)", b.Version)
	}
	dir, err := b.Run(context.Background(), nil)
	if err != nil {
		t.Fatalf("build helm: %v", err)
	}
	return filepath.Join(dir, "helm")
}

// runHelm runs helm with its cache and configuration in a scratch
// directory, from the repository's root.
func runHelm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(helm(t), args...)
	cmd.Dir = ".."
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, errors.New(err.Error() + ": " + stderr.String())
	}
	return out, nil
}

// render renders the chart as `helm template` does with set's values,
// and decodes every object strictly into its API type: a field the API
// does not have fails, as an API server's validation would.
func render(t *testing.T, set ...string) map[string]any {
	t.Helper()
	args := []string{"template", "weir", "deploy/helm/weir", "--namespace", "kube-system", "--include-crds"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := runHelm(t, args...)
	if err != nil {
		t.Fatalf("helm template %v: %v", set, err)
	}
	return decodeAll(t, out)
}

// decodeAll decodes a stream of YAML documents into typed objects, keyed
// by kind/name.
func decodeAll(t *testing.T, stream []byte) map[string]any {
	t.Helper()
	objs := map[string]any{}
	for _, doc := range strings.Split(string(stream), "\n---") {
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("decode %q: %v", doc, err)
		}
		if meta.Kind == "" {
			continue // comments alone
		}
		var obj any
		switch meta.Kind {
		case "DaemonSet":
			obj = &appsv1.DaemonSet{}
		case "Job":
			obj = &batchv1.Job{}
		case "ConfigMap":
			obj = &corev1.ConfigMap{}
		case "Service":
			obj = &corev1.Service{}
		case "ServiceAccount":
			obj = &corev1.ServiceAccount{}
		case "ClusterRole":
			obj = &rbacv1.ClusterRole{}
		case "ClusterRoleBinding":
			obj = &rbacv1.ClusterRoleBinding{}
		case "CustomResourceDefinition":
			obj = &apiextensionsv1.CustomResourceDefinition{}
		case "ServiceMonitor":
			obj = &map[string]any{} // the Prometheus Operator's type: not in Weir's dependencies
		default:
			t.Fatalf("the chart renders a %s (%s) this test does not know", meta.Kind, meta.Metadata.Name)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s %s does not decode strictly: %v\n%s", meta.Kind, meta.Metadata.Name, err, doc)
		}
		objs[meta.Kind+"/"+meta.Metadata.Name] = obj
	}
	return objs
}

// TestChartDefaults: with its defaults the chart installs the four CRDs,
// RBAC that lets the agent read every custom kind it watches, the agent's
// ConfigMap and a DaemonSet whose agent reads that ConfigMap, probes the
// health port the configuration opens, and mounts pod network namespaces
// and bpffs with the propagation they need.
func TestChartDefaults(t *testing.T) {
	objs := render(t)
	for _, k := range []string{
		"CustomResourceDefinition/securityidentities.weir.io",
		"CustomResourceDefinition/clusternetworkpolicies.policy.networking.k8s.io",
		"CustomResourceDefinition/weirclusternetworkpolicies.weir.io",
		"CustomResourceDefinition/weirnetworkpolicies.weir.io",
		"ServiceAccount/weir-agent", "ClusterRole/weir-agent", "ClusterRoleBinding/weir-agent",
		"ConfigMap/weir-config", "DaemonSet/weir-agent", "Job/weir-upgrade-check",
	} {
		if objs[k] == nil {
			t.Errorf("the chart renders no %s", k)
		}
	}
	if len(objs) != 10 {
		t.Errorf("%d objects, want 10: %v", len(objs), keys(objs))
	}
	checkAgentReads(t, objs["ClusterRole/weir-agent"].(*rbacv1.ClusterRole))
	cm := objs["ConfigMap/weir-config"].(*corev1.ConfigMap)
	for flag, want := range map[string]string{
		"mode": "vxlan", "tunnel-port": "4789", "mtu": "0", "cluster-cidr": "10.244.0.0/16", "kube-proxy-replacement": "false",
		"health-addr": "127.0.0.1:9879", "metrics-addr": ":9880", "socket": "/run/weir/agent.sock", "cni-conf-dir": "/etc/cni/net.d",
		"flow-events": "true", "flow-max-bytes": "67108864", "cgroup-root": "/run/weir/cgroup2", "sysctl-dir": "/host/proc/sys", "cni-exclusive": "true", "mount-bpffs": "false",
	} {
		if got := cm.Data[flag]; got != want {
			t.Errorf("ConfigMap %s = %q, want %q", flag, got, want)
		}
	}
	ds := objs["DaemonSet/weir-agent"].(*appsv1.DaemonSet)
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork || spec.ServiceAccountName != "weir-agent" || spec.PriorityClassName != "system-node-critical" ||
		len(spec.Tolerations) != 1 || spec.Tolerations[0].Operator != corev1.TolerationOpExists {
		t.Fatalf("pod spec %+v: want host network, the weir-agent account, node-critical, every taint tolerated", spec)
	}
	agent := spec.Containers[0]
	if agent.Image != "ghcr.io/weirnet/weir-agent:"+version.Version {
		t.Errorf("image %s, want the chart's appVersion, %s", agent.Image, version.Version)
	}
	checkAgentCapabilities(t, spec)
	if !slices.Contains(agent.Args, "--config-dir=/etc/weir/config") || !slices.Contains(agent.Args, "--node-name=$(NODE_NAME)") {
		t.Errorf("agent args %v: want it to read the ConfigMap and know its node", agent.Args)
	}
	for _, p := range []*corev1.Probe{agent.ReadinessProbe, agent.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Host != "127.0.0.1" || p.HTTPGet.Port.IntValue() != 9879 || p.HTTPGet.Path != api.PathHealth {
			t.Errorf("probe %+v: want GET http://127.0.0.1:9879/v1/healthz", p)
		}
	}
	if len(spec.Volumes) != len(agent.VolumeMounts) || len(spec.InitContainers) != 2 {
		t.Errorf("%d volumes for %d mounts, %d init containers", len(spec.Volumes), len(agent.VolumeMounts), len(spec.InitContainers))
	}
	if ann := ds.Spec.Template.Annotations; ann["prometheus.io/port"] != "9880" || ann["weir.io/config-checksum"] == "" {
		t.Errorf("pod annotations %v: want Prometheus on 9880 and the configuration's checksum", ann)
	}
	if len(agent.Ports) != 1 || agent.Ports[0].ContainerPort != 9880 {
		t.Errorf("agent ports %+v: want metrics on 9880", agent.Ports)
	}
	for _, e := range agent.Env {
		if e.Name == "KUBERNETES_SERVICE_HOST" {
			t.Errorf("KUBERNETES_SERVICE_HOST set without k8sServiceHost")
		}
	}
	if agent.TerminationMessagePolicy != corev1.TerminationMessageFallbackToLogsOnError {
		t.Errorf("termination message policy %q: an agent refusing to start must say why in its pod's status", agent.TerminationMessagePolicy)
	}
	checkUpgradeJob(t, objs["Job/weir-upgrade-check"].(*batchv1.Job), ds)
}

// checkAgentReads: the agent's role lets it list and watch each custom
// kind the agent watches; without one its caches never sync.
func checkAgentReads(t *testing.T, role *rbacv1.ClusterRole) {
	t.Helper()
	for _, gvr := range []schema.GroupVersionResource{k8s.IdentityResource, k8s.ClusterPolicyResource,
		k8s.WeirClusterPolicyResource, k8s.WeirNetworkPolicyResource} {
		verbs := map[string]bool{}
		for _, r := range role.Rules {
			if slices.Contains(r.APIGroups, gvr.Group) && slices.Contains(r.Resources, gvr.Resource) {
				for _, v := range r.Verbs {
					verbs[v] = true
				}
			}
		}
		if !verbs["get"] || !verbs["list"] || !verbs["watch"] {
			t.Errorf("the agent's role lets it %v on %s.%s, want get, list and watch", slices.Sorted(maps.Keys(verbs)), gvr.Resource, gvr.Group)
		}
	}
}

// checkAgentCapabilities: the agent is not privileged but has the four
// capabilities it uses and no other; it writes sysctls through the host's
// /proc/sys/net and reaches the mounts mount-fs made (HostToContainer),
// and mount-fs, privileged, makes them reach the node (Bidirectional). The
// agent's ConfigMap names the mounts' places.
func checkAgentCapabilities(t *testing.T, spec corev1.PodSpec) {
	t.Helper()
	agent, mountFS := spec.Containers[0], spec.InitContainers[0]
	sc := agent.SecurityContext
	if sc == nil || (sc.Privileged != nil && *sc.Privileged) || sc.Capabilities == nil ||
		fmt.Sprint(sc.Capabilities.Add) != "[NET_ADMIN SYS_ADMIN BPF PERFMON]" || fmt.Sprint(sc.Capabilities.Drop) != "[ALL]" {
		t.Errorf("agent security context %+v: want not privileged, NET_ADMIN, SYS_ADMIN, BPF and PERFMON alone", sc)
	}
	if mountFS.Name != "mount-fs" || mountFS.SecurityContext == nil || mountFS.SecurityContext.Privileged == nil || !*mountFS.SecurityContext.Privileged ||
		!slices.Equal(mountFS.Command, []string{"/usr/bin/weir-agent", "mount-fs", "--config-dir=/etc/weir/config"}) {
		t.Errorf("first init container %s %v %+v: want mount-fs, privileged", mountFS.Name, mountFS.Command, mountFS.SecurityContext)
	}
	propagation := func(c corev1.Container) map[string]corev1.MountPropagationMode {
		out := map[string]corev1.MountPropagationMode{}
		for _, m := range c.VolumeMounts {
			if m.MountPropagation != nil {
				out[m.MountPath] = *m.MountPropagation
			}
		}
		return out
	}
	to, bi := corev1.MountPropagationHostToContainer, corev1.MountPropagationBidirectional
	if got, want := propagation(agent), map[string]corev1.MountPropagationMode{"/var/run/netns": to, "/sys/fs/bpf": to, "/run/weir": to}; !maps.Equal(got, want) {
		t.Errorf("agent propagation %v, want %v: pod namespaces and mount-fs's mounts reach it; a container that is not privileged may not have Bidirectional", got, want)
	}
	if got, want := propagation(mountFS), map[string]corev1.MountPropagationMode{"/var/run/netns": to, "/sys/fs/bpf": bi, "/run/weir": bi}; !maps.Equal(got, want) {
		t.Errorf("mount-fs propagation %v, want %v: its bpffs and cgroup2 mounts must reach the node", got, want)
	}
	sysctl := false
	for _, m := range agent.VolumeMounts {
		sysctl = sysctl || (m.MountPath == "/host/proc/sys/net" && !m.ReadOnly)
	}
	for _, v := range spec.Volumes {
		if v.Name == "proc-sys-net" && (v.HostPath == nil || v.HostPath.Path != "/proc/sys/net") {
			sysctl = false
		}
	}
	if !sysctl {
		t.Error("the agent needs the host's /proc/sys/net, writable, at /host/proc/sys/net")
	}
}

// checkUpgradeJob: the upgrade check is a pre-upgrade hook, kept when it
// fails, running the new image's weir-agent check-upgrade once where an
// agent runs, on the node's network, with the agent's host paths read-only
// and the running release's ConfigMap.
func checkUpgradeJob(t *testing.T, job *batchv1.Job, ds *appsv1.DaemonSet) {
	t.Helper()
	if job.Annotations["helm.sh/hook"] != "pre-upgrade" || strings.Contains(job.Annotations["helm.sh/hook-delete-policy"], "hook-failed") {
		t.Errorf("upgrade check annotations %v: want a pre-upgrade hook kept when it fails", job.Annotations)
	}
	spec, agent := job.Spec.Template.Spec, ds.Spec.Template.Spec
	if job.Spec.BackoffLimit == nil || *job.Spec.BackoffLimit != 0 || !spec.HostNetwork || spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("upgrade check job %+v: want one try, on the host network", job.Spec)
	}
	if fmt.Sprint(spec.NodeSelector, spec.PriorityClassName) != fmt.Sprint(agent.NodeSelector, agent.PriorityClassName) {
		t.Errorf("upgrade check placed by %v %q, the agents by %v %q", spec.NodeSelector, spec.PriorityClassName, agent.NodeSelector, agent.PriorityClassName)
	}
	// A node NotReady or unreachable (NoExecute taints) is no place for a
	// one-shot check.
	if len(spec.Tolerations) != 1 || spec.Tolerations[0].Effect != corev1.TaintEffectNoSchedule {
		t.Errorf("upgrade check tolerates %+v: want NoSchedule taints alone", spec.Tolerations)
	}
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && (v.ConfigMap.Optional == nil || !*v.ConfigMap.Optional) {
			t.Error("the upgrade check needs the running release's ConfigMap, which a release without agents has not")
		}
	}
	c := spec.Containers[0]
	if c.Image != agent.Containers[0].Image || !slices.Equal(c.Command, []string{"/usr/bin/weir-agent", "check-upgrade", "--config-dir=/etc/weir/config"}) {
		t.Errorf("upgrade check runs %s %v", c.Image, c.Command)
	}
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		if !m.ReadOnly {
			t.Errorf("upgrade check mounts %s writable", m.MountPath)
		}
		mounts[m.MountPath] = true
	}
	for _, m := range agent.Containers[0].VolumeMounts {
		if !mounts[m.MountPath] && m.Name != "proc-sys-net" {
			t.Errorf("upgrade check lacks the agent's mount %s", m.MountPath)
		}
	}
}

// TestChartValueSets: the values operators set reach the agent: native
// routing, another tunnel port and MTU, kube-proxy beside it, no metrics
// port, the API server's address, extra flags; a changed configuration
// changes the checksum that rolls the agents; the metrics Service and
// ServiceMonitor and the dashboard; agent.enabled=false leaves the CRDs
// and RBAC alone with the extra group bound.
func TestChartValueSets(t *testing.T) {
	def := render(t)["DaemonSet/weir-agent"].(*appsv1.DaemonSet)
	objs := render(t, "routingMode=native", "tunnelPort=8472", "mtu=1400", "kubeProxyReplacement=true", "metrics.port=0",
		"k8sServiceHost=10.0.0.1", "k8sServicePort=6443", "agent.extraArgs={--identity-option=false}",
		"image.tag=v9", "image.pullPolicy=Always")
	cm := objs["ConfigMap/weir-config"].(*corev1.ConfigMap)
	for flag, want := range map[string]string{"mode": "native", "tunnel-port": "8472", "mtu": "1400", "kube-proxy-replacement": "true"} {
		if cm.Data[flag] != want {
			t.Errorf("ConfigMap %s = %q, want %q", flag, cm.Data[flag], want)
		}
	}
	if _, ok := cm.Data["metrics-addr"]; ok {
		t.Errorf("metrics.port=0 still configures metrics-addr %q", cm.Data["metrics-addr"])
	}
	ds := objs["DaemonSet/weir-agent"].(*appsv1.DaemonSet)
	agent := ds.Spec.Template.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range agent.Env {
		env[e.Name] = e.Value
	}
	if env["KUBERNETES_SERVICE_HOST"] != "10.0.0.1" || env["KUBERNETES_SERVICE_PORT"] != "6443" {
		t.Errorf("env %v: want the API server at 10.0.0.1:6443", env)
	}
	if !slices.Contains(agent.Args, "--identity-option=false") || agent.Image != "ghcr.io/weirnet/weir-agent:v9" || agent.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("args %v image %s %s", agent.Args, agent.Image, agent.ImagePullPolicy)
	}
	if len(agent.Ports) != 0 || ds.Spec.Template.Annotations["prometheus.io/scrape"] != "" {
		t.Errorf("metrics.port=0 still exposes metrics: ports %v, annotations %v", agent.Ports, ds.Spec.Template.Annotations)
	}
	if ds.Spec.Template.Annotations["weir.io/config-checksum"] == def.Spec.Template.Annotations["weir.io/config-checksum"] {
		t.Error("another configuration has the same checksum: an upgrade would not roll the agents")
	}

	// An IPv6 address to listen on is bracketed, as the agent parses it.
	cm = render(t, "metrics.bindAddress=fd00::1")["ConfigMap/weir-config"].(*corev1.ConfigMap)
	if cm.Data["metrics-addr"] != "[fd00::1]:9880" {
		t.Errorf("metrics-addr %q, want [fd00::1]:9880", cm.Data["metrics-addr"])
	}

	objs = render(t, "metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom", "dashboards.enabled=true", "dashboards.namespace=monitoring")
	if svc, ok := objs["Service/weir-agent-metrics"].(*corev1.Service); !ok || svc.Spec.ClusterIP != corev1.ClusterIPNone || svc.Spec.Ports[0].Port != 9880 {
		t.Errorf("metrics Service %+v", objs["Service/weir-agent-metrics"])
	}
	sm, ok := objs["ServiceMonitor/weir-agent"].(*map[string]any)
	if !ok || !strings.Contains(mustYAML(t, *sm), "release: prom") {
		t.Errorf("ServiceMonitor %v", objs["ServiceMonitor/weir-agent"])
	}
	dash, ok := objs["ConfigMap/weir-dashboard"].(*corev1.ConfigMap)
	want, err := os.ReadFile("../docs/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if !ok || dash.Namespace != "monitoring" || dash.Labels["grafana_dashboard"] != "1" || dash.Data["weir.json"] != strings.TrimRight(string(want), "\n") {
		t.Errorf("dashboard ConfigMap: present %v, namespace %q, labels %v, the dashboard as in docs: %v", ok, dash.Namespace, dash.Labels,
			ok && dash.Data["weir.json"] == strings.TrimRight(string(want), "\n"))
	}

	if _, ok := render(t, "upgradeCheck.enabled=false")["Job/weir-upgrade-check"]; ok {
		t.Error("upgradeCheck.enabled=false still renders the upgrade check")
	}

	// The escape hatch: a privileged agent, which may have Bidirectional.
	priv := render(t, "agent.privileged=true")["DaemonSet/weir-agent"].(*appsv1.DaemonSet).Spec.Template.Spec.Containers[0]
	if sc := priv.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged || sc.Capabilities != nil {
		t.Errorf("agent.privileged=true: security context %+v, want privileged", sc)
	}
	for _, m := range priv.VolumeMounts {
		if m.MountPath == "/sys/fs/bpf" && (m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional) {
			t.Errorf("agent.privileged=true: bpffs propagation %v, want Bidirectional as the values say", m.MountPropagation)
		}
	}

	objs = render(t, "agent.enabled=false", "rbac.extraGroups={weir:agents}")
	if objs["DaemonSet/weir-agent"] != nil || objs["ConfigMap/weir-config"] != nil || len(objs) != 7 {
		t.Errorf("agent.enabled=false renders %v, want the CRDs and RBAC alone", keys(objs))
	}
	crb := objs["ClusterRoleBinding/weir-agent"].(*rbacv1.ClusterRoleBinding)
	if len(crb.Subjects) != 2 || crb.Subjects[1].Kind != "Group" || crb.Subjects[1].Name != "weir:agents" {
		t.Errorf("binding subjects %+v, want the service account and the group weir:agents", crb.Subjects)
	}
}

// TestChartRefusesBadValues: values.schema.json turns a misspelt key or an
// impossible value into an install-time error that names it.
func TestChartRefusesBadValues(t *testing.T) {
	for set, want := range map[string]string{
		"routingMod=vxlan":                                   "additional properties 'routingMod' not allowed",
		"routingMode=geneve":                                 "'vxlan', 'native'",
		"mtu=100":                                            "/mtu",
		"tunnelPort=70000":                                   "/tunnelPort",
		"clusterCIDR=10.244.0.0":                             "/clusterCIDR",
		"agent.paths.state=var/lib/weir":                     "/agent/paths/state",
		"image.pullPolicy=Sometimes":                         "/image/pullPolicy",
		"agent.extraArgs={identity=false}":                   "/agent/extraArgs/0",
		"metrics.serviceMonitor.enabled=true,metrics.port=0": "needs metrics.port",
		"kubeProxyReplacement=true":                          "needs k8sServiceHost",
		"metrics.port=9879":                                  "the same port",
		"k8sServicePort=99999":                               "/k8sServicePort",
		"agent.paths.cgroupRoot=/sys/fs/cgroup":              "/agent/paths/cgroupRoot",
		"agent.privileged=yes":                               "/agent/privileged",
		"agent.paths.cgroupRoot=/var/lib/weir-cgroup2":       "lies below no agent.hostMounts entry with propagation Bidirectional",
		"cni.exclusiv=false":                                 "additional properties 'exclusiv' not allowed",
	} {
		_, err := runHelm(t, "template", "weir", "deploy/helm/weir", "--set", set)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--set %s: %v, want an error saying %q", set, err, want)
		}
	}
}

// TestChartLints: helm lint --strict passes with the defaults and with the
// other value sets.
func TestChartLints(t *testing.T) {
	for _, set := range [][]string{nil, {"routingMode=native", "kubeProxyReplacement=true", "k8sServiceHost=10.0.0.1"}, {"agent.enabled=false"},
		{"metrics.serviceMonitor.enabled=true", "dashboards.enabled=true"}} {
		args := []string{"lint", "--strict", "deploy/helm/weir"}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		if out, err := runHelm(t, args...); err != nil {
			t.Errorf("helm lint %v: %v\n%s", set, err, out)
		}
	}
}

// TestPlainManifestMatchesChart: deploy/weir.yaml, for clusters without
// Helm, is the chart rendered with its defaults (and the CRDs). With
// WEIR_UPDATE_DEPLOY=1 the test writes it.
func TestPlainManifestMatchesChart(t *testing.T) {
	// No hooks: the upgrade check belongs to helm upgrade; applied with the
	// rest it would run once, at install.
	out, err := runHelm(t, "template", "weir", "deploy/helm/weir", "--namespace", "kube-system", "--include-crds", "--no-hooks")
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte(plainHeader), out...)
	if os.Getenv("WEIR_UPDATE_DEPLOY") == "1" {
		if err := os.WriteFile("weir.yaml", want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile("weir.yaml")
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("deploy/weir.yaml is not the chart's defaults rendered (%v): run WEIR_UPDATE_DEPLOY=1 go test ./deploy -run TestPlainManifestMatchesChart", err)
	}
	decodeAll(t, got)
}

const plainHeader = `# Weir for clusters without Helm: deploy/helm/weir rendered with its
# default values into kube-system, without the chart's upgrade check (a
# helm upgrade hook). Generated; edit the chart, then run
#   WEIR_UPDATE_DEPLOY=1 go test ./deploy -run TestPlainManifestMatchesChart
# Apply with: kubectl apply --server-side -f deploy/weir.yaml
`

// TestChartCopiesAreCurrent: the chart carries the CRDs generated in
// deploy/ and the dashboard of docs/, byte for byte, and is versioned
// with Weir.
func TestChartCopiesAreCurrent(t *testing.T) {
	for from, to := range map[string]string{
		"crds.yaml":                           "helm/weir/crds/securityidentities.yaml",
		"crd-clusternetworkpolicies.yaml":     "helm/weir/crds/clusternetworkpolicies.yaml",
		"crd-weirclusternetworkpolicies.yaml": "helm/weir/crds/weirclusternetworkpolicies.yaml",
		"crd-weirnetworkpolicies.yaml":        "helm/weir/crds/weirnetworkpolicies.yaml",
		"../docs/grafana-dashboard.json":      "helm/weir/dashboards/weir.json",
	} {
		a, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		b, err := deploy.Chart.ReadFile(to)
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s is not a copy of %s (%v): run go generate ./deploy", to, from, err)
		}
	}
	var chart struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	b, err := deploy.Chart.ReadFile("helm/weir/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		t.Fatal(err)
	}
	if chart.Version != version.Version || chart.AppVersion != version.Version {
		t.Errorf("Chart.yaml version %s appVersion %s, want both %s (internal/version)", chart.Version, chart.AppVersion, version.Version)
	}
}

// TestWriteChart writes the embedded chart out whole.
func TestWriteChart(t *testing.T) {
	dir, err := deploy.WriteChart(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"Chart.yaml", "values.yaml", "values.schema.json", "templates/daemonset.yaml", "crds/securityidentities.yaml", ".helmignore"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("written chart lacks %s: %v", f, err)
		}
	}
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func mustYAML(t *testing.T, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

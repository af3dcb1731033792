package deploy

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/weirnet/weir/internal/api"
)

func TestRenderAgentDefaults(t *testing.T) {
	b, err := RenderAgent(DefaultAgentParams("example/weir-agent:v1"))
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(b, &ds); err != nil {
		t.Fatalf("rendered DaemonSet does not decode strictly: %v\n%s", err, b)
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork || spec.ServiceAccountName != "weir-agent" || len(spec.Tolerations) != 1 || spec.Tolerations[0].Operator != corev1.TolerationOpExists {
		t.Fatalf("pod spec %+v: want host network, the weir-agent account, every taint tolerated", spec)
	}
	agent := spec.Containers[0]
	if agent.SecurityContext == nil || agent.SecurityContext.Privileged == nil || !*agent.SecurityContext.Privileged {
		t.Fatal("agent must be privileged")
	}
	for _, p := range []*corev1.Probe{agent.ReadinessProbe, agent.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Host != "127.0.0.1" || p.HTTPGet.Port.IntValue() != 9879 || p.HTTPGet.Path != api.PathHealth {
			t.Fatalf("probe %+v: want GET http://127.0.0.1:9879/v1/healthz", p)
		}
	}
	if !slices.Contains(agent.Args, "--health-addr=127.0.0.1:9879") {
		t.Fatalf("agent args %v: the probed port must be the one the agent serves", agent.Args)
	}
	prop := map[string]corev1.MountPropagationMode{}
	for _, m := range agent.VolumeMounts {
		if m.MountPropagation != nil {
			prop[m.MountPath] = *m.MountPropagation
		}
	}
	if prop["/var/run/netns"] != corev1.MountPropagationHostToContainer || prop["/sys/fs/bpf"] != corev1.MountPropagationBidirectional {
		t.Fatalf("propagation %v: pod netns must reach the agent, its bpffs mounts the host", prop)
	}
	if len(spec.Volumes) != len(agent.VolumeMounts) || len(spec.InitContainers) != 1 {
		t.Fatalf("%d volumes for %d mounts, %d init containers", len(spec.Volumes), len(agent.VolumeMounts), len(spec.InitContainers))
	}
	if ann := ds.Spec.Template.Annotations; ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != "9880" || ann["prometheus.io/path"] != "/metrics" {
		t.Fatalf("pod annotations %v: want Prometheus to scrape :9880/metrics", ann)
	}
	if len(agent.Ports) != 1 || agent.Ports[0].Name != "metrics" || agent.Ports[0].ContainerPort != 9880 {
		t.Fatalf("agent ports %+v: want metrics on 9880", agent.Ports)
	}
	if !slices.Contains(agent.Args, "--metrics-addr=:9880") {
		t.Fatalf("agent args %v: the scraped port must be the one the agent serves", agent.Args)
	}
	want := map[string]bool{"--kubernetes": true, "--node-name=$(NODE_NAME)": true, "--cni-conf-dir=/etc/cni/net.d": true, "--socket=/run/weir/agent.sock": true}
	for _, a := range agent.Args {
		delete(want, a)
	}
	if len(want) > 0 {
		t.Fatalf("args %v lack %v", agent.Args, want)
	}
}

func TestRenderAgentWithoutMetricsPort(t *testing.T) {
	p := DefaultAgentParams("example/weir-agent:v1")
	p.MetricsPort = 0
	b, err := RenderAgent(p)
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(b, &ds); err != nil {
		t.Fatalf("rendered DaemonSet does not decode strictly: %v\n%s", err, b)
	}
	agent := ds.Spec.Template.Spec.Containers[0]
	if len(ds.Spec.Template.Annotations) != 0 || len(agent.Ports) != 0 || slices.ContainsFunc(agent.Args, func(a string) bool { return strings.HasPrefix(a, "--metrics-addr") }) {
		t.Fatalf("metrics port 0: annotations %v, ports %v, args %v: want no metrics listener", ds.Spec.Template.Annotations, agent.Ports, agent.Args)
	}
	p.MetricsPort = p.HealthPort
	if _, err := RenderAgent(p); err == nil {
		t.Fatal("metrics on the health port rendered")
	}
}

package deploy

import (
	"bytes"
	"fmt"
	"text/template"
)

// AgentParams are the knobs of the agent DaemonSet. Paths are host paths,
// mounted at the same place in the container; $(NODE_NAME) in a path
// argument is expanded by Kubernetes, which lets several nodes share one
// host file system (the lab).
type AgentParams struct {
	Image, PullPolicy        string
	Mode, ClusterCIDR        string
	StateDir, Socket, PinDir string
	CNIConfDir, CNIBinDir    string
	// APIServerHost and APIServerPort, if set, are where the agent reaches
	// the API server instead of the kubernetes Service, which needs
	// kube-proxy (or Weir's own service handling) to be working first.
	APIServerHost, APIServerPort string
	// HealthPort is the node-local (127.0.0.1) TCP port of the agent's
	// health check, which the kubelet probes over HTTP: cheaper than an
	// exec probe, which starts a process in the container every period.
	HealthPort int
	// MetricsPort is the TCP port, on every address of the node, where
	// Prometheus scrapes the agent's /metrics; the pod's annotations
	// say so. 0: the agent serves metrics on its socket alone.
	MetricsPort int
	// KubeProxyReplacement runs the agents with --kube-proxy-replacement
	// (the default): for clusters without kube-proxy. Off, the agents
	// translate pods' ClusterIP connections only and leave the rest to
	// kube-proxy.
	KubeProxyReplacement bool
	Mounts               []Mount
}

// Mount is a host directory the agent needs.
type Mount struct {
	Name, Path string
	// Propagation is empty, HostToContainer (mounts the host makes later
	// must reach the agent: pod network namespaces) or Bidirectional
	// (mounts the agent makes must reach the host: bpffs).
	Propagation string
}

// DefaultAgentParams are the paths of an ordinary node.
func DefaultAgentParams(image string) AgentParams {
	return AgentParams{
		Image: image, PullPolicy: "IfNotPresent", Mode: "vxlan", ClusterCIDR: "10.244.0.0/16",
		StateDir: "/var/lib/weir", Socket: "/run/weir/agent.sock", PinDir: "/sys/fs/bpf/weir",
		CNIConfDir: "/etc/cni/net.d", CNIBinDir: "/opt/cni/bin", HealthPort: 9879, MetricsPort: 9880,
		KubeProxyReplacement: true,
		Mounts: []Mount{
			{Name: "state", Path: "/var/lib/weir"}, {Name: "run", Path: "/run/weir"},
			{Name: "bpffs", Path: "/sys/fs/bpf", Propagation: "Bidirectional"},
			// Where runtimes mount pod network namespaces; the agent
			// plumbs veths into namespaces made after it started.
			{Name: "netns", Path: "/var/run/netns", Propagation: "HostToContainer"},
			{Name: "cni-conf", Path: "/etc/cni/net.d"}, {Name: "cni-bin", Path: "/opt/cni/bin"},
		},
	}
}

// RenderAgent renders the agent DaemonSet.
func RenderAgent(p AgentParams) ([]byte, error) {
	if p.HealthPort < 1 || p.HealthPort > 65535 {
		return nil, fmt.Errorf("render weir-agent DaemonSet: health port %d: want 1-65535", p.HealthPort)
	}
	if p.MetricsPort < 0 || p.MetricsPort > 65535 || p.MetricsPort == p.HealthPort {
		return nil, fmt.Errorf("render weir-agent DaemonSet: metrics port %d: want 1-65535 other than the health port, or 0 for none", p.MetricsPort)
	}
	t, err := template.ParseFS(Manifests, "weir-agent.yaml.tmpl")
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := t.Execute(&b, p); err != nil {
		return nil, fmt.Errorf("render weir-agent DaemonSet: %w", err)
	}
	return b.Bytes(), nil
}

package lab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
)

// cgroupControllers are the v1 hierarchies kubelet needs a root in.
var cgroupControllers = []string{"cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd"}

// kubeNodePaths are the per-node files of a Kubernetes lab node.
type kubeNodePaths struct {
	dir, data                          string
	containerdSock, containerdConf     string
	cniConfDir, cniBinDir, kubeletConf string
	kubeletRoot, cgroupRoot            string
}

func (st *State) kubePaths(n *Node) kubeNodePaths {
	dir := filepath.Join(st.RunDir, n.Name)
	data := filepath.Join(st.Kube.DataDir, n.Name)
	return kubeNodePaths{
		dir: dir, data: data,
		containerdSock: filepath.Join(dir, "containerd", "containerd.sock"),
		containerdConf: filepath.Join(dir, "containerd.toml"),
		cniConfDir:     filepath.Join(dir, "cni", "net.d"),
		cniBinDir:      filepath.Join(dir, "cni", "bin"),
		kubeletConf:    filepath.Join(dir, "kubelet.yaml"),
		kubeletRoot:    filepath.Join(data, "kubelet"),
		cgroupRoot:     "/" + n.NetNS,
	}
}

// startKubeNode brings up one node: its cgroup roots, containerd with the
// lab's images, kubelet, kube-proxy and the Weir agent.
func (st *State) startKubeNode(ctx context.Context, p *pki, n *Node, images []string) error {
	kp := st.kubePaths(n)
	for _, d := range []string{kp.dir, kp.data, kp.cniConfDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := makeCgroupRoot(kp.cgroupRoot); err != nil {
		return err
	}
	// Host-network clients of Services (kube-proxy's own checks, agents
	// in pods with hostNetwork) need a route for the service range before
	// kube-proxy's rules can translate it.
	if err := inNS(n.NetNS, routeServices); err != nil {
		return err
	}
	if err := p.kubeconfig(st.kubeconfigPath("node-"+n.Name), apiServerURL(), "node-"+n.Name); err != nil {
		return err
	}
	if err := os.WriteFile(kp.containerdConf, []byte(st.containerdConfig(n, kp)), 0o644); err != nil {
		return err
	}
	if st.Config.BridgeRuntime {
		if err := st.writeBridgeConf(kp, nodeIndex(n)); err != nil {
			return err
		}
	}
	if err := st.run(n.Name+"/containerd", n.NetNS, st.KubeBin("containerd"), "--config", kp.containerdConf); err != nil {
		return err
	}
	if err := waitSocket(ctx, kp.containerdSock, 30*time.Second); err != nil {
		pr, _ := st.proc(n.Name + "/containerd")
		return fmt.Errorf("containerd of %s: %w; log:\n%s", n.Name, err, tail(pr.Log, 20))
	}
	for _, img := range images {
		cmd := exec.CommandContext(ctx, st.KubeBin("ctr"), "-a", kp.containerdSock, "-n", "k8s.io", "images", "import", "--local", img)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("import %s into %s: %w: %s", filepath.Base(img), n.Name, err, out)
		}
	}
	if err := os.WriteFile(kp.kubeletConf, []byte(st.kubeletConfig(p, n, kp)), 0o644); err != nil {
		return err
	}
	if err := st.run(n.Name+"/kubelet", n.NetNS, st.KubeBin("kubelet"),
		"--config", kp.kubeletConf, "--kubeconfig", st.kubeconfigPath("node-"+n.Name),
		"--root-dir", kp.kubeletRoot, "--hostname-override", n.Name, "--node-ip", n.IP.String(),
		"--cert-dir", filepath.Join(kp.data, "kubelet-pki"), "--v=1",
	); err != nil {
		return err
	}
	if st.replacesKubeProxy() {
		// Weir's agents answer Services: no kube-proxy on the node.
	} else if err := st.startKubeProxy(n, kp); err != nil {
		return err
	}
	if st.Config.AgentMode != AgentHost {
		return nil // the DaemonSet brings the agent
	}
	return st.run(n.Name+"/weir-agent", n.NetNS, filepath.Join(st.Config.BinDir, "weir-agent"),
		"--kubernetes", "--kubeconfig", st.kubeconfigPath("weir-agent"),
		"--node-name", n.Name, "--mode", string(st.Config.Mode), "--underlay-dev", "eth0",
		"--node-ip", n.IP.String(), "--cluster-cidr", st.Config.ClusterCIDR.String(),
		"--state-dir", n.StateDir, "--bpf-pin-dir", n.PinDir, "--socket", n.Socket,
		"--cni-conf-dir", kp.cniConfDir, "--kube-proxy-replacement="+strconv.FormatBool(st.replacesKubeProxy()),
	)
}

// replacesKubeProxy says the lab runs no kube-proxy: Weir's agents do its
// work.
func (st *State) replacesKubeProxy() bool { return st.Config.KubeProxy == KubeProxyNone }

func (st *State) startKubeProxy(n *Node, kp kubeNodePaths) error {
	// Weir delivers packets from other nodes straight into pods, so for a
	// flow another node translated (a NodePort whose backend is here, a
	// node's own ClusterIP connection) this node's conntrack sees only the
	// replies and calls them INVALID; iptables-mode kube-proxy drops
	// INVALID packets unless the node is liberal in TCP tracking, which it
	// reads once as it starts. Set before kube-proxy starts, as
	// conntrack.tcpBeLiberal asks it to do itself.
	if err := inNS(n.NetNS, func() error {
		return os.WriteFile("/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal", []byte("1"), 0o644)
	}); err != nil {
		return fmt.Errorf("liberal TCP conntrack for kube-proxy on %s: %w", n.Name, err)
	}
	conf := filepath.Join(kp.dir, "kube-proxy.yaml")
	content := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: %s
clusterCIDR: %s
hostnameOverride: %s
bindAddress: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
clientConnection:
  kubeconfig: %s
conntrack:
  # conntrack limits are global to the machine, not the node namespace.
  maxPerCore: 0
  min: 0
  tcpBeLiberal: true
`, st.Config.KubeProxy, st.Config.ClusterCIDR, n.Name, n.IP, st.kubeconfigPath("kube-proxy"))
	if err := os.WriteFile(conf, []byte(content), 0o644); err != nil {
		return err
	}
	return st.run(n.Name+"/kube-proxy", n.NetNS, st.KubeBin("kube-proxy"), "--config", conf, "--v=1")
}

// containerdConfig is one node's containerd: its own root, state, sockets,
// runc root and CNI directories, NRI off (two containerds would fight over
// its socket), and the OOM score left alone (this machine refuses to lower
// it).
func (st *State) containerdConfig(n *Node, kp kubeNodePaths) string {
	return fmt.Sprintf(`version = 3
root = %q
state = %q

[grpc]
  address = %q
[ttrpc]
  address = %q

[plugins."io.containerd.nri.v1.nri"]
  disable = true

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = %q

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  # pod network namespaces under this node's state, not /var/run/netns
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%q]
    conf_dir = %q
    use_internal_loopback = true
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
      BinaryName = "/usr/sbin/runc"
      Root = %q
      SystemdCgroup = false

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
%s`, filepath.Join(kp.data, "containerd"), filepath.Join(kp.dir, "containerd", "state"),
		kp.containerdSock, kp.containerdSock+".ttrpc", PauseImage,
		st.cniBinDir(kp), kp.cniConfDir, filepath.Join(kp.dir, "runc"), st.bridgeRuntime(kp))
}

// bridgeRuntime is the containerd runtime handler of the "bridge"
// RuntimeClass: runc like the default, with its own CNI config directory
// holding the reference bridge plugin's config.
func (st *State) bridgeRuntime(kp kubeNodePaths) string {
	if !st.Config.BridgeRuntime {
		return ""
	}
	return fmt.Sprintf(`
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.bridge]
  runtime_type = "io.containerd.runc.v2"
  cni_conf_dir = %q
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.bridge.options]
    BinaryName = "/usr/sbin/runc"
    Root = %q
    SystemdCgroup = false
`, filepath.Join(kp.dir, "cni", "bridge.d"), filepath.Join(kp.dir, "runc"))
}

// BridgeSubnet is node i's (1-based) range for pods of the bridge
// RuntimeClass, apart from Weir's cluster CIDR.
func BridgeSubnet(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 245, byte(i), 0}), 24)
}

// writeBridgeConf writes the bridge runtime's CNI config on node i.
func (st *State) writeBridgeConf(kp kubeNodePaths, i int) error {
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"bridge","plugins":[{"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":false,`+
		`"ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],"dataDir":%q}}]}`,
		BridgeSubnet(i).String(), filepath.Join(kp.dir, "cni", "host-local"))
	dir := filepath.Join(kp.dir, "cni", "bridge.d")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "10-bridge.conflist"), []byte(conf), 0o644)
}

// cniBinDir is where the node's runtime finds weir-cni: installed by the
// DaemonSet's init container, or the lab's build directory for host agents.
func (st *State) cniBinDir(kp kubeNodePaths) string {
	if st.Config.CNIBinDir != "" {
		return st.Config.CNIBinDir
	}
	if st.Config.AgentMode == AgentHost {
		return st.Config.BinDir
	}
	return kp.cniBinDir
}

// kubeletConfig is one node's kubelet: cgroup v1 through cgroupfs under a
// root of its own, webhook authorization, cluster DNS, relaxed node
// pressure eviction (the lab's nodes share one disk) but pods' own
// ephemeral-storage limits enforced (a pod that writes past its limit is
// evicted, as the Services spec on evicted pods needs), no resolver of
// the machine's.
func (st *State) kubeletConfig(p *pki, n *Node, kp kubeNodePaths) string {
	resolv := filepath.Join(kp.dir, "resolv.conf")
	os.WriteFile(resolv, []byte("# the lab has no upstream resolver\n"), 0o644)
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %s
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
address: %s
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: [%s]
resolvConf: %s
failSwapOn: false
localStorageCapacityIsolation: true
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 250
`, kp.cgroupRoot, kp.containerdSock, filepath.Join(kp.data, "pod-logs"), n.IP, p.path("ca.crt"), ClusterDNSIP, resolv)
}

// makeCgroupRoot creates root in every v1 hierarchy; cpuset needs its
// cpus and mems before anything can join it.
func makeCgroupRoot(root string) error {
	for _, c := range cgroupControllers {
		base := filepath.Join("/sys/fs/cgroup", c)
		if _, err := os.Stat(base); err != nil {
			continue
		}
		dir := filepath.Join(base, root)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create cgroup %s: %w", dir, err)
		}
		if c != "cpuset" {
			continue
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			b, err := os.ReadFile(filepath.Join(base, f))
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
				return fmt.Errorf("cgroup %s/%s: %w", dir, f, err)
			}
		}
	}
	return nil
}

// routeServices sends the service range out of the node's eth0; kube-proxy
// translates it before it leaves.
func routeServices() error {
	l, err := netlink.LinkByName("eth0")
	if err != nil {
		return err
	}
	_, dst, _ := net.ParseCIDR(serviceCIDR.String())
	if err := netlink.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("route %v: %w", serviceCIDR, err)
	}
	return nil
}

// waitSocket waits for a unix socket to accept connections.
func waitSocket(ctx context.Context, path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.Dial("unix", path)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not accepting after %s: %w", path, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// nodeIndex is the 1-based number in a node's name (n1 -> 1).
func nodeIndex(n *Node) int {
	i, _ := strconv.Atoi(strings.TrimPrefix(n.Name, "n"))
	return i
}

// CNIDirs are where node n's runtime reads its CNI config and plugins.
func (st *State) CNIDirs(n *Node) (confDir, binDir string) {
	kp := st.kubePaths(n)
	return kp.cniConfDir, st.cniBinDir(kp)
}

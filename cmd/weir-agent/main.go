// Command weir-agent is Weir's node agent: flags become an agent.Config and
// agent.Run does the rest.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/weirnet/weir/internal/agent"
	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/cni"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/flowstore"
	"github.com/weirnet/weir/internal/version"
)

// flags are the command line, kept as strings until validated together.
type flags struct {
	node, mode, underlay, nodeIP, podCIDR, clusterCIDR string
	stateDir, pinDir, socket, peersFile, healthAddr    string
	metricsAddr                                        string
	kubeconfig, cniConfDir, flowDir                    string
	kubernetes, flowEvents, identityOption             bool
	kubeProxyReplacement                               bool
	socketLB                                           bool
	proxyHealthzAddr                                   string
	proxyStatusAddr                                    string
	flowMaxBytes                                       int64
	tunnelPort                                         uint16
	mtu                                                int
	configDir                                          string
	cgroupRoot, sysctlDir                              string
	cniExclusive, mountBPFFS                           bool
}

func main() {
	if err := newCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "weir-agent:", err)
		os.Exit(1)
	}
}

// newVersionCommand is `weir-agent version`: this binary's build.
func newVersionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Show this agent binary's version, commit and Go toolchain",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch output {
			case "json":
				return json.NewEncoder(cmd.OutOrStdout()).Encode(version.Get())
			case "":
				_, err := fmt.Fprintln(cmd.OutOrStdout(), "weir-agent", version.Get())
				return err
			}
			return fmt.Errorf("--output %q: want json or empty", output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "json: as JSON; empty: one line")
	return cmd
}

func newCommand() *cobra.Command {
	var f flags
	cmd := &cobra.Command{
		Use:          "weir-agent",
		Short:        "Weir node agent: pod IPAM, eBPF datapath and the local CNI API",
		SilenceUsage: true,
		Args:         cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.configDir != "" {
				warnings, err := applyConfigDir(cmd.Flags(), f.configDir)
				for _, w := range warnings {
					fmt.Fprintln(os.Stderr, "weir-agent: warning:", w)
				}
				if err != nil {
					return err
				}
			}
			cfg, err := f.config()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("node", cfg.NodeName)
			return agent.Run(ctx, cfg, log)
		},
	}
	cmd.AddCommand(newHealthCommand(), newVersionCommand(), newInstallCNICommand(), newRelayCommand(), newProbeCommand(), newUninstallCommand(), newCheckUpgradeCommand(), newMountFSCommand())
	host, _ := os.Hostname()
	fl := cmd.Flags()
	fl.StringVar(&f.node, "node-name", host, "this node's name")
	fl.StringVar(&f.mode, "mode", string(datapath.ModeVXLAN), "how pod traffic reaches other nodes: vxlan or native")
	fl.StringVar(&f.underlay, "underlay-dev", "eth0", "the interface that reaches other nodes")
	fl.StringVar(&f.nodeIP, "node-ip", "", "this node's address on the underlay (required unless --kubernetes: then the Node's InternalIP)")
	fl.StringVar(&f.podCIDR, "pod-cidr", "", "the CIDR this node assigns pod addresses from (required unless --kubernetes: then the Node's spec.podCIDR)")
	fl.StringVar(&f.clusterCIDR, "cluster-cidr", "10.244.0.0/16", "the CIDR of every pod in the cluster")
	fl.StringVar(&f.stateDir, "state-dir", "/var/lib/weir", "directory for durable state (IPAM leases)")
	fl.StringVar(&f.pinDir, "bpf-pin-dir", "/sys/fs/bpf/weir", "bpffs directory for this node's maps and links")
	fl.BoolVar(&f.mountBPFFS, "mount-bpffs", true, "mount bpffs under --bpf-pin-dir when none is there (false: refuse to start instead; for an agent in a container that is not privileged, whose mount would go with the container and the pins with it)")
	fl.StringVar(&f.cgroupRoot, "cgroup-root", "", "a mount of the machine's cgroup v2 hierarchy to attach the socket programs to, e.g. "+datapath.DefaultCgroupRoot+" from `weir-agent mount-fs` (empty: the first cgroup2 mount this process sees, or one mounted at "+datapath.DefaultCgroupRoot+"; inside a cgroup namespace that is the container's own cgroup, which the agent refuses)")
	fl.StringVar(&f.sysctlDir, "sysctl-dir", datapath.DefaultSysctlDir, "where the kernel's sysctls are (its net/ at least): /proc/sys is read-only in a container that is not privileged, so the chart binds the host's /proc/sys/net at /host/proc/sys/net and passes /host/proc/sys")
	fl.StringVar(&f.socket, "socket", api.DefaultSocket, "unix socket of the local API")
	fl.StringVar(&f.healthAddr, "health-addr", "", "TCP host:port answering GET "+api.PathHealth+" for the kubelet's probes, e.g. 127.0.0.1:9879 (empty: none)")
	fl.StringVar(&f.metricsAddr, "metrics-addr", "", "TCP host:port serving Prometheus metrics on "+agent.PathMetrics+", e.g. :9880 for every address (empty: only the --socket serves them)")
	fl.StringVar(&f.peersFile, "peers-file", "", "JSON list of other nodes ({name,nodeIP,podCIDR}) to program at start")
	fl.BoolVar(&f.kubernetes, "kubernetes", false, "run as a Kubernetes node agent: node, peers and pods come from the API server")
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig to reach the API server (--kubernetes; empty: the pod's service account)")
	fl.StringVar(&f.cniConfDir, "cni-conf-dir", "", "directory to write the CNI config into once the agent is ready (--kubernetes), e.g. /etc/cni/net.d")
	fl.BoolVar(&f.cniExclusive, "cni-exclusive", true, "with --cni-conf-dir: set every other CNI's config there aside (renamed to <name>"+cni.SetAsideSuffix+"; weir-agent uninstall gives them back), since the runtime takes the first by name and another's may sort before Weir's (false: leave them, and make sure "+cni.ConfListName+" sorts first)")
	fl.StringVar(&f.flowDir, "flow-dir", "", "directory keeping this node's flows across restarts (empty: <state-dir>/flows, /var/lib/weir/flows by default)")
	fl.Int64Var(&f.flowMaxBytes, "flow-max-bytes", flowstore.DefaultMaxBytes, "bytes of flows --flow-dir keeps; the oldest are dropped first")
	fl.BoolVar(&f.flowEvents, "flow-events", true, "record a flow for every verdict (false: the datapath emits no verdict events, for measuring their cost)")
	fl.BoolVar(&f.kubeProxyReplacement, "kube-proxy-replacement", false, "no kube-proxy runs on this node: translate ClusterIPs for the node's own processes and hostNetwork pods too, keep sessionAffinity: ClientIP, and refuse connections to Services without backends at once (false: pods' ClusterIP connections only; kube-proxy answers the rest)")
	fl.BoolVar(&f.socketLB, "socket-lb", true, "translate pods' ClusterIP connections at the socket (false, which needs --kube-proxy-replacement=false: Weir leaves every Service to kube-proxy, e.g. for a service mesh whose sidecars must see ClusterIPs, or to measure kube-proxy beside Weir)")
	fl.StringVar(&f.proxyHealthzAddr, "kube-proxy-healthz-addr", "0.0.0.0:10256", "with --kube-proxy-replacement: where kube-proxy's /healthz and /livez are answered, as cloud load balancers probe them (empty: not served)")
	fl.StringVar(&f.proxyStatusAddr, "kube-proxy-status-addr", "127.0.0.1:10249", "with --kube-proxy-replacement: where kube-proxy's /proxyMode is answered (empty: not served)")
	fl.Uint16Var(&f.tunnelPort, "tunnel-port", datapath.VXLANPort, "the overlay's UDP port (--mode=vxlan), the same on every node")
	fl.IntVar(&f.mtu, "mtu", 0, "the pods' MTU (0: the underlay device's, less 50 bytes of VXLAN in vxlan mode); set it lower where the underlay's path carries less than its device says. A change reaches pods created after it")
	fl.StringVar(&f.configDir, "config-dir", "", "a directory of files named after flags, each holding the flag's value (a mounted ConfigMap); a flag given on the command line wins")
	fl.BoolVar(&f.identityOption, "identity-option", true, "native routing: carry the sending pod's identity in the first packet of each flow as an IPv4 option, so other nodes know a new pod from its first packet (false: for underlays that drop IPv4 options; a new pod is then unidentified on other nodes until its address arrives)")
	return cmd
}

// config validates the flags as a whole.
func (f flags) config() (agent.Config, error) {
	mode, err := datapath.ParseMode(f.mode)
	if err != nil {
		return agent.Config{}, fmt.Errorf("--mode: %w", err)
	}
	var nodeIP netip.Addr
	if f.nodeIP != "" || !f.kubernetes {
		if nodeIP, err = netip.ParseAddr(f.nodeIP); err != nil {
			return agent.Config{}, fmt.Errorf("--node-ip %q: want an IP address: %w", f.nodeIP, err)
		}
	}
	var podCIDR netip.Prefix
	if f.podCIDR != "" || !f.kubernetes {
		if podCIDR, err = netip.ParsePrefix(f.podCIDR); err != nil {
			return agent.Config{}, fmt.Errorf("--pod-cidr %q: want a CIDR such as 10.244.1.0/24: %w", f.podCIDR, err)
		}
	}
	if !f.kubernetes && (f.kubeconfig != "" || f.cniConfDir != "") {
		return agent.Config{}, fmt.Errorf("--kubeconfig and --cni-conf-dir need --kubernetes")
	}
	if f.healthAddr != "" {
		if _, err := netip.ParseAddrPort(f.healthAddr); err != nil {
			return agent.Config{}, fmt.Errorf("--health-addr %q: want an address and port such as 127.0.0.1:9879: %w", f.healthAddr, err)
		}
	}
	if f.metricsAddr != "" {
		if err := checkListenAddr(f.metricsAddr); err != nil {
			return agent.Config{}, fmt.Errorf("--metrics-addr %q: want [address]:port such as :9880 or 127.0.0.1:9880: %w", f.metricsAddr, err)
		}
	}
	for flag, addr := range map[string]string{"--kube-proxy-healthz-addr": f.proxyHealthzAddr, "--kube-proxy-status-addr": f.proxyStatusAddr} {
		if addr == "" {
			continue
		}
		if err := checkListenAddr(addr); err != nil {
			return agent.Config{}, fmt.Errorf("%s %q: want [address]:port such as 0.0.0.0:10256, or empty for none: %w", flag, addr, err)
		}
	}
	if f.kubeProxyReplacement && !f.socketLB {
		return agent.Config{}, errors.New("--socket-lb=false leaves Services to kube-proxy, which --kube-proxy-replacement says is not there: drop one of them")
	}
	if f.tunnelPort == 0 {
		return agent.Config{}, fmt.Errorf("--tunnel-port 0: want 1-65535 (%d is VXLAN's)", datapath.VXLANPort)
	}
	if f.mtu < 0 {
		return agent.Config{}, fmt.Errorf("--mtu %d: want a pod MTU such as 1450, or 0 for the underlay's", f.mtu)
	}
	if f.flowMaxBytes <= 0 {
		return agent.Config{}, fmt.Errorf("--flow-max-bytes %d: want a positive number of bytes, such as %d (64 MiB)", f.flowMaxBytes, flowstore.DefaultMaxBytes)
	}
	clusterCIDR, err := netip.ParsePrefix(f.clusterCIDR)
	if err != nil {
		return agent.Config{}, fmt.Errorf("--cluster-cidr %q: want a CIDR: %w", f.clusterCIDR, err)
	}
	cfg := agent.Config{
		NodeName: f.node, Mode: mode, UnderlayDev: f.underlay, NodeIP: nodeIP,
		PodCIDR: podCIDR, ClusterCIDR: clusterCIDR, StateDir: f.stateDir, PinDir: f.pinDir, Socket: f.socket, HealthAddr: f.healthAddr,
		Kubernetes: f.kubernetes, Kubeconfig: f.kubeconfig, CNIConfDir: f.cniConfDir, MetricsAddr: f.metricsAddr,
		FlowDir: f.flowDir, FlowMaxBytes: f.flowMaxBytes, NoFlowEvents: !f.flowEvents,
		NoIdentityOption:     !f.identityOption,
		KubeProxyReplacement: f.kubeProxyReplacement, NoSocketLB: !f.socketLB,
		ProxyHealthzAddr: f.proxyHealthzAddr, ProxyStatusAddr: f.proxyStatusAddr,
		TunnelPort: f.tunnelPort, MTU: f.mtu,
		CgroupRoot: f.cgroupRoot, SysctlDir: f.sysctlDir, CNIShared: !f.cniExclusive, NoMountBPFFS: !f.mountBPFFS,
	}
	if f.peersFile != "" {
		b, err := os.ReadFile(f.peersFile)
		if err != nil {
			return agent.Config{}, fmt.Errorf("--peers-file: %w", err)
		}
		if err := json.Unmarshal(b, &cfg.Peers); err != nil {
			return agent.Config{}, fmt.Errorf("--peers-file %s: want a JSON list of {name,nodeIP,podCIDR}: %w", f.peersFile, err)
		}
	}
	return cfg, nil
}

// checkListenAddr accepts a TCP port with an IP address or none (every
// address).
func checkListenAddr(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return err
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("port %q: want 1-65535", port)
	}
	if host != "" {
		if _, err := netip.ParseAddr(host); err != nil {
			return err
		}
	}
	return nil
}

// newHealthCommand is the DaemonSet's probe: exit 0 when the agent on
// this node answers its API.
func newHealthCommand() *cobra.Command {
	var socket string
	cmd := &cobra.Command{
		Use:          "health",
		Short:        "Exit 0 if the node's agent answers on its socket",
		SilenceUsage: true,
		Args:         cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 3*time.Second)
			defer cancel()
			return api.NewClient(socket).Health(ctx)
		},
	}
	cmd.Flags().StringVar(&socket, "socket", defaultSocket(), "unix socket of the local API (default from $WEIR_AGENT_SOCKET)")
	return cmd
}

// defaultSocket is the agent's socket as the DaemonSet's containers know
// it ($WEIR_AGENT_SOCKET), or the default one.
func defaultSocket() string {
	if s := os.Getenv("WEIR_AGENT_SOCKET"); s != "" {
		return s
	}
	return api.DefaultSocket
}

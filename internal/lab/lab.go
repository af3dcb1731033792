package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/datapath/bpffs"
)

// Config describes a lab.
type Config struct {
	Name        string        // prefix of every namespace, directory and pin
	Nodes       int           // number of nodes
	PodsPerNode int           // pods Up creates on each node
	Mode        datapath.Mode // vxlan or native
	BinDir      string        // holds weir-agent and weir-cni
	ClusterCIDR netip.Prefix
	// CNI is the plugin pods are attached with: CNIWeir (default),
	// CNIBridge for the reference baseline benchmarks compare against, or
	// CNINone for a Kubernetes lab that waits for Weir's chart.
	CNI string
	// Kubernetes makes the lab a real cluster: a control plane, and on
	// every node containerd, kubelet, kube-proxy and the Weir agent as a
	// Kubernetes node agent. Pods then come from the API, not from
	// PodsPerNode.
	Kubernetes bool `json:"kubernetes,omitempty"`
	// AgentMode is how a Kubernetes lab runs weir-agent: AgentDaemonSet
	// (default), the way users deploy it, or AgentHost, a process per
	// node started by the lab, for development.
	AgentMode string `json:"agentMode,omitempty"`
	// BridgeRuntime adds a second runtime handler, "bridge", whose pods are
	// attached by the reference bridge + host-local plugins, and a
	// RuntimeClass of that name: benchmarks compare both on one cluster.
	BridgeRuntime bool `json:"bridgeRuntime,omitempty"`
	// CNIBinDir, if set, is the only directory the nodes' runtimes look
	// for CNI plugins in (host agent mode), e.g. a benchmark's timing
	// wrappers.
	CNIBinDir string `json:"cniBinDir,omitempty"`
	// KubeProxy is the Service proxy of a Kubernetes lab: KubeProxyNone
	// (default), where Weir's agents replace kube-proxy
	// (--kube-proxy-replacement), or kube-proxy in KubeProxyNFTables or
	// KubeProxyIPTables mode beside agents that leave Services to it.
	KubeProxy string `json:"kubeProxy,omitempty"`
	// Release, if set, is a commit of this repository whose chart and
	// agent image a Kubernetes lab installs instead of the tree's (both
	// images are imported: UpgradeWeir then upgrades to the tree's, as
	// `helm upgrade` to a new version would).
	Release string `json:"release,omitempty"`
}

// Service proxies of a Kubernetes lab.
const (
	KubeProxyNFTables = "nftables"
	KubeProxyIPTables = "iptables"
	KubeProxyNone     = "none"
)

// How a Kubernetes lab runs its agents.
const (
	AgentDaemonSet = "daemonset"
	AgentHost      = "host"
)

// DefaultName is the lab the CLI manages unless told otherwise.
const DefaultName = "weir-lab"

// Validate reports the first problem with the config.
func (c *Config) Validate() error {
	if c.Name == "" || len(c.Name) > 10 || strings.ContainsAny(c.Name, "/ .") {
		return fmt.Errorf("lab name %q: want 1-10 characters without '/', '.' or spaces", c.Name)
	}
	if c.Nodes < 1 || c.Nodes > 50 {
		return fmt.Errorf("--nodes %d: want 1 to 50", c.Nodes)
	}
	if c.PodsPerNode < 0 || c.PodsPerNode > 200 {
		return fmt.Errorf("--pods %d: want 0 to 200 per node", c.PodsPerNode)
	}
	if _, err := datapath.ParseMode(string(c.Mode)); err != nil {
		return err
	}
	switch c.CNI {
	case "":
		c.CNI = CNIWeir
	case CNIWeir:
	case CNIBridge:
		if c.Kubernetes {
			return fmt.Errorf("CNI %q: a Kubernetes lab runs Weir (or %s, to install it yourself)", c.CNI, CNINone)
		}
	case CNINone:
		if !c.Kubernetes || c.AgentMode == AgentHost || c.Release != "" {
			return fmt.Errorf("CNI %q: only a Kubernetes lab with agent mode %s and no --release comes up without a CNI (pods of a lab without Kubernetes need one)", c.CNI, AgentDaemonSet)
		}
	default:
		return fmt.Errorf("CNI %q: want %s, %s or %s", c.CNI, CNIWeir, CNIBridge, CNINone)
	}
	if c.CNIBinDir != "" && c.AgentMode != AgentHost {
		return fmt.Errorf("a CNI bin dir of its own needs agent mode %s (the DaemonSet installs weir-cni itself)", AgentHost)
	}
	switch c.KubeProxy {
	case "":
		c.KubeProxy = KubeProxyNone
	case KubeProxyNFTables, KubeProxyIPTables, KubeProxyNone:
	default:
		return fmt.Errorf("kube-proxy %q: want %s, %s or %s (Weir replaces it)", c.KubeProxy, KubeProxyNFTables, KubeProxyIPTables, KubeProxyNone)
	}
	switch c.AgentMode {
	case "":
		c.AgentMode = AgentDaemonSet
	case AgentDaemonSet, AgentHost:
	default:
		return fmt.Errorf("agent mode %q: want %s or %s", c.AgentMode, AgentDaemonSet, AgentHost)
	}
	if c.Release != "" && (!c.Kubernetes || c.AgentMode != AgentDaemonSet) {
		return fmt.Errorf("release %s: an earlier release is installed with its chart, which needs the Kubernetes lab with agent mode %s", c.Release, AgentDaemonSet)
	}
	if !c.ClusterCIDR.IsValid() {
		c.ClusterCIDR = netip.MustParsePrefix("10.244.0.0/16")
	}
	if !c.ClusterCIDR.Addr().Is4() || c.ClusterCIDR.Bits() > 16 {
		return fmt.Errorf("cluster CIDR %v: want an IPv4 /16 or larger", c.ClusterCIDR)
	}
	for _, bin := range c.binaries() {
		if _, err := os.Stat(filepath.Join(c.BinDir, bin)); err != nil {
			return fmt.Errorf("%s not found in %s (build it with `make build` or pass --bin-dir): %w", bin, c.BinDir, err)
		}
	}
	return nil
}

// binaries are what the lab runs from BinDir.
func (c *Config) binaries() []string {
	if c.CNI == CNIBridge {
		return nil // the reference plugins come from the build cache
	}
	if c.Kubernetes {
		return []string{"weir", "weir-agent", "weir-cni", "weir-pause"}
	}
	return []string{"weir-agent", "weir-cni"}
}

// Node is one node of a running lab.
type Node struct {
	Name     string       `json:"name"`
	NetNS    string       `json:"netns"`
	IP       netip.Addr   `json:"ip"`
	PodCIDR  netip.Prefix `json:"podCIDR"`
	AgentPID int          `json:"agentPID"`
	Socket   string       `json:"socket"`
	StateDir string       `json:"stateDir"`
	PinDir   string       `json:"pinDir"`
	Log      string       `json:"log"`
}

// Pod is one pod of a running lab.
type Pod struct {
	Name        string     `json:"name"`
	Node        string     `json:"node"`
	NetNS       string     `json:"netns"`
	ContainerID string     `json:"containerID"`
	IP          netip.Addr `json:"ip"`
	// AddLatency is how long the CNI ADD took, namespace creation excluded.
	AddLatency time.Duration `json:"addLatency"`
}

// State is a running lab, saved in RunDir/lab.json.
type State struct {
	Config   Config     `json:"config"`
	RunDir   string     `json:"runDir"`
	Underlay string     `json:"underlay"`
	ExtHost  string     `json:"extHost"`
	ExtIP    netip.Addr `json:"extIP"`
	Nodes    []Node     `json:"nodes"`
	Pods     []Pod      `json:"pods"`
	// PluginDirs is the CNI_PATH the lab's runtime searches.
	PluginDirs []string `json:"pluginDirs"`
	// Kube is the cluster of a Kubernetes lab.
	Kube *KubeState `json:"kube,omitempty"`
}

// RunDir is where a lab keeps its state, sockets and logs.
func RunDir(name string) string { return filepath.Join("/run", name) }

// pinRoot is the bpffs directory holding every node's pins.
func pinRoot(name string) string { return filepath.Join("/sys/fs/bpf", name) }

// NodePinDir is where node's agent pins its maps and links.
func (st *State) NodePinDir(node string) string { return filepath.Join(pinRoot(st.Config.Name), node) }

// Up builds the lab and returns its state. On failure everything made so
// far is removed again.
func Up(ctx context.Context, cfg Config, out io.Writer) (_ *State, retErr error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(RunDir(cfg.Name), "lab.json")); err == nil {
		return nil, fmt.Errorf("lab %s is already up (run `weir lab down --name %s` first)", cfg.Name, cfg.Name)
	}
	st := &State{Config: cfg, RunDir: RunDir(cfg.Name), Underlay: cfg.Name + "-ul", ExtHost: cfg.Name + "-ext", ExtIP: extHostIP}
	defer func() {
		if retErr != nil {
			if err := Down(context.Background(), cfg.Name, io.Discard); err != nil {
				retErr = errors.Join(retErr, fmt.Errorf("clean up failed lab: %w", err))
			}
		}
	}()
	if err := os.MkdirAll(st.RunDir, 0o755); err != nil {
		return nil, err
	}
	// Down releases it: the last lab (or test) to leave unmounts it.
	if _, err := bpffs.Ensure(pinRoot(cfg.Name)); err != nil {
		return nil, err
	}
	if err := st.save(); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "lab %s: underlay %v, %d nodes, %s mode\n", cfg.Name, underlayNet, cfg.Nodes, cfg.Mode)
	if err := buildUnderlay(st.Underlay); err != nil {
		return nil, err
	}
	if err := plugHost(st.Underlay, st.ExtHost, "ext", extHostIP); err != nil {
		return nil, err
	}
	for i := 1; i <= cfg.Nodes; i++ {
		n := st.newNode(i)
		if err := plugHost(st.Underlay, n.NetNS, n.Name, n.IP); err != nil {
			return nil, err
		}
		st.Nodes = append(st.Nodes, n)
	}
	st.PluginDirs = []string{cfg.BinDir}
	if cfg.Kubernetes {
		if err := st.upKubernetes(ctx, out); err != nil {
			return nil, err
		}
		return st, nil
	}
	if cfg.CNI == CNIBridge {
		ref, err := ReferencePlugins(ctx)
		if err != nil {
			return nil, err
		}
		st.PluginDirs = append(st.PluginDirs, ref)
		for i := range st.Nodes {
			if err := st.setupBridgeNode(i + 1); err != nil {
				return nil, err
			}
		}
	} else if err := st.startAgents(ctx, out); err != nil {
		return nil, err
	}
	if err := st.save(); err != nil {
		return nil, err
	}
	for _, n := range st.Nodes {
		for j := 1; j <= cfg.PodsPerNode; j++ {
			p, err := st.AddPod(ctx, n.Name, fmt.Sprintf("%s-p%d", n.Name, j))
			if err != nil {
				return nil, err
			}
			fmt.Fprintf(out, "  pod  %-8s on %-4s %v\n", p.Name, p.Node, p.IP)
		}
	}
	return st, nil
}

// startAgents starts every node's weir-agent, each knowing all peers.
func (st *State) startAgents(ctx context.Context, out io.Writer) error {
	if err := st.writePeers(); err != nil {
		return err
	}
	for i := range st.Nodes {
		if err := st.startAgent(ctx, &st.Nodes[i]); err != nil {
			return err
		}
		if err := st.save(); err != nil {
			return err
		}
		fmt.Fprintf(out, "  node %-4s %-12v pods %-14v agent pid %d\n", st.Nodes[i].Name, st.Nodes[i].IP, st.Nodes[i].PodCIDR, st.Nodes[i].AgentPID)
	}
	return nil
}

func (st *State) newNode(i int) Node {
	name := fmt.Sprintf("n%d", i)
	dir := filepath.Join(st.RunDir, name)
	return Node{
		Name:     name,
		NetNS:    st.Config.Name + "-" + name,
		IP:       nodeIP(i),
		PodCIDR:  podCIDR(st.Config.ClusterCIDR, i),
		Socket:   filepath.Join(dir, "agent.sock"),
		StateDir: filepath.Join(dir, "state"),
		PinDir:   filepath.Join(pinRoot(st.Config.Name), name),
		Log:      filepath.Join(dir, "agent.log"),
	}
}

// Peers lists every node as the agents see each other.
func (st *State) Peers() []api.Peer {
	out := make([]api.Peer, 0, len(st.Nodes))
	for _, n := range st.Nodes {
		out = append(out, api.Peer{Name: n.Name, NodeIP: n.IP, PodCIDR: n.PodCIDR})
	}
	return out
}

func (st *State) writePeers() error {
	b, err := json.MarshalIndent(st.Peers(), "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(st.RunDir, "peers.json"), b, 0o644)
}

// NodeByName finds a node.
func (st *State) NodeByName(name string) (*Node, error) {
	for i := range st.Nodes {
		if st.Nodes[i].Name == name {
			return &st.Nodes[i], nil
		}
	}
	return nil, fmt.Errorf("lab %s has no node %q", st.Config.Name, name)
}

// Client returns an API client for a node's agent.
func (n *Node) Client() *api.Client { return api.NewClient(n.Socket) }

func (st *State) save() error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(st.RunDir, ".lab.json")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(st.RunDir, "lab.json"))
}

// Load reads the state of a running lab.
func Load(name string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(RunDir(name), "lab.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("lab %s is not up (start it with `weir lab up`)", name)
	}
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("lab state %s: %w", name, err)
	}
	return &st, nil
}

// waitHealthy polls an agent until it answers or the deadline passes.
func waitHealthy(ctx context.Context, c *api.Client, pid int, log string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if err := c.Health(ctx); err == nil {
			return nil
		}
		if !processAlive(pid) {
			return fmt.Errorf("agent pid %d exited during start; its log %s says:\n%s", pid, log, tail(log, 20))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent pid %d not healthy after 30s; log %s:\n%s", pid, log, tail(log, 20))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func tail(path string, lines int) string {
	b, _ := os.ReadFile(path)
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/weirnet/weir/internal/datapath/bpffs"
)

// OverlayDevice is the name of the node's VXLAN device.
const OverlayDevice = "weir_vxlan"

// VXLANPort is the UDP port of the overlay (IANA's VXLAN port).
const VXLANPort = 4789

// vxlanOverhead is what VXLAN over IPv4 adds to every packet: outer
// Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8.
const vxlanOverhead = 50

// The pod MTUs NodeConfig.MTU accepts: IPv4's least that every link
// carries, up to a jumbo frame.
const (
	minPodMTU = 576
	maxPodMTU = 9000
)

// routeProtocol tags every route Weir installs so it can find and remove
// exactly its own (see /etc/iproute2/rt_protos; 0xe8 is unassigned).
const routeProtocol = netlink.RouteProtocol(0xe8)

// NodeConfig describes one node's datapath.
type NodeConfig struct {
	Name        string
	Mode        Mode
	UnderlayDev string       // the interface that reaches other nodes
	NodeIP      netip.Addr   // this node's address on UnderlayDev
	PodCIDR     netip.Prefix // the addresses this node gives its pods
	ClusterCIDR netip.Prefix // every pod address in the cluster
	PinDir      string       // bpffs directory for this node's pins
	// CgroupRoot is the cgroup v2 directory the socket programs attach to;
	// empty: the machine's cgroup v2 root (mounted if need be).
	CgroupRoot string
	// NoMountBPFFS: the pin directory must be on a bpf filesystem the node
	// has mounted; the node mounts none itself (an agent in a container
	// that is not privileged, whose mount would not reach the host).
	NoMountBPFFS bool
	// SysctlDir is where the kernel's sysctls are read and written (its
	// net/ at least); empty: DefaultSysctlDir.
	SysctlDir string
	// NetNS, when set, is the namespace the node lives in; otherwise the
	// caller's. Tests and the lab use it to run many nodes in one process.
	NetNS string
	// NoFlowEvents turns the datapath's verdict events off (see
	// SetFlowEvents).
	NoFlowEvents bool
	// NoIdentityOption: see ProgramConfig.
	NoIdentityOption bool
	// KubeProxyReplacement is for nodes where no kube-proxy runs beside
	// Weir: Service addresses are translated for the node's own processes
	// and hostNetwork pods too, not only for its pods, and packets from
	// outside the cluster to NodePorts, external IPs and load balancer IPs
	// are translated in from_netdev (ProgramConfig.ExternalServices).
	KubeProxyReplacement bool
	// HashSeed: see ProgramConfig.
	HashSeed uint64
	// TunnelPort is the overlay's UDP port (vxlan mode), the same on
	// every node; 0: VXLANPort.
	TunnelPort uint16
	// MTU is the pods' MTU; 0: the underlay device's, less the overlay's
	// overhead in vxlan mode. Set it below that where the underlay's path
	// carries less than its device says (a cloud's own encapsulation).
	MTU int
}

// sysctls is where this node's sysctls are written.
func (n *Node) sysctls() sysctlDir {
	if n.cfg.SysctlDir == "" {
		return DefaultSysctlDir
	}
	return sysctlDir(n.cfg.SysctlDir)
}

// OverlayPort is the overlay's UDP port in effect.
func (c NodeConfig) OverlayPort() uint16 {
	if c.TunnelPort == 0 {
		return VXLANPort
	}
	return c.TunnelPort
}

// Validate reports the first thing that is wrong with the config.
func (c NodeConfig) Validate() error {
	switch {
	case c.Name == "":
		return errors.New("node name is empty")
	case c.UnderlayDev == "":
		return errors.New("underlay device is empty")
	case !c.NodeIP.IsValid():
		return errors.New("node IP is not set")
	case !c.PodCIDR.IsValid():
		return errors.New("pod CIDR is not set")
	case !c.ClusterCIDR.IsValid() || !c.ClusterCIDR.Contains(c.PodCIDR.Addr()):
		return fmt.Errorf("cluster CIDR %v does not contain pod CIDR %v", c.ClusterCIDR, c.PodCIDR)
	case c.PinDir == "":
		return errors.New("pin directory is empty")
	case c.MTU != 0 && (c.MTU < minPodMTU || c.MTU > maxPodMTU):
		return fmt.Errorf("MTU %d: want %d to %d, or 0 for the underlay's", c.MTU, minPodMTU, maxPodMTU)
	}
	_, err := ParseMode(string(c.Mode))
	return err
}

// Node is the datapath of one node: its programs, maps and devices.
type Node struct {
	cfg       NodeConfig
	nodeNS    ns.NetNS // nil: the caller's namespace
	nl        *netlink.Handle
	progs     *Programs
	endpoints endpointMap
	tunnels   tunnelMap
	peerNodes peerNodeMap
	podMTU    int
	// trace is the instance Trace runs packets through, loaded on first use.
	traceMu sync.Mutex
	trace   *tracePrograms
	// afterWrite, if set, runs after each map write of a policy apply
	// (tests judge packets against every intermediate state).
	afterWrite func()
	// lbWritten is what the service maps hold after the last SetServices
	// or UpdateServices that wrote everything it meant to; nil: read them
	// first.
	lbWritten lbMaps
	// l7 holds the HTTP sets written, once EnableL7 made the node read
	// requests; nil: HTTP-restricted allows are written closed.
	l7 *nodeL7
	// l7objs is bpf/l7.c as SetupL7 loaded it; nil until then.
	l7objs *l7Objects
}

// SetupNode prepares the node (sysctls, overlay device, programs, masquerade)
// and returns a handle on it. It is idempotent: a restarted agent calls it
// again and adopts the pinned maps and links the running datapath uses.
func SetupNode(cfg NodeConfig) (_ *Node, retErr error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid node config: %w", err)
	}
	n := &Node{cfg: cfg}
	defer func() {
		if retErr != nil {
			n.Close()
		}
	}()
	if cfg.NetNS != "" {
		nodeNS, err := getNS(cfg.NetNS)
		if err != nil {
			return nil, err
		}
		n.nodeNS = nodeNS
		if n.nl, err = netlink.NewHandleAt(netnsHandle(nodeNS)); err != nil {
			return nil, fmt.Errorf("netlink handle in %s: %w", cfg.NetNS, err)
		}
	} else {
		var err error
		if n.nl, err = netlink.NewHandle(); err != nil {
			return nil, fmt.Errorf("netlink handle: %w", err)
		}
	}
	if cfg.NoMountBPFFS {
		if err := bpffs.Require(filepath.Dir(cfg.PinDir)); err != nil {
			return nil, err
		}
	} else if _, err := bpffs.Ensure(filepath.Dir(cfg.PinDir)); err != nil {
		return nil, err
	}
	for _, sub := range []string{"links", "links-egress", "devices", "cgroup"} {
		if err := os.MkdirAll(filepath.Join(cfg.PinDir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("create pin directory: %w", err)
		}
	}
	err := n.do(func() error {
		if err := n.sysctls().setNodeSysctls(); err != nil {
			return err
		}
		return n.setupDevices()
	})
	if err != nil {
		return nil, err
	}
	return n, nil
}

func (n *Node) setupDevices() error {
	under, err := n.nl.LinkByName(n.cfg.UnderlayDev)
	if err != nil {
		return fmt.Errorf("underlay device %s: %w", n.cfg.UnderlayDev, err)
	}
	n.podMTU = under.Attrs().MTU
	if n.cfg.Mode == ModeVXLAN {
		n.podMTU -= vxlanOverhead
	}
	if n.cfg.MTU != 0 {
		if n.cfg.MTU > n.podMTU {
			return fmt.Errorf("MTU %d: more than %s carries (%d for pods in %s mode)", n.cfg.MTU, n.cfg.UnderlayDev, n.podMTU, n.cfg.Mode)
		}
		n.podMTU = n.cfg.MTU
	}
	overlayIfindex := 0
	if n.cfg.Mode == ModeVXLAN {
		vx, err := n.ensureVXLAN(n.podMTU)
		if err != nil {
			return err
		}
		overlayIfindex = vx.Attrs().Index
	}
	n.progs, err = LoadPrograms(ProgramConfig{Mode: n.cfg.Mode, OverlayIfindex: overlayIfindex,
		PodCIDR: n.cfg.PodCIDR, ClusterCIDR: n.cfg.ClusterCIDR, PinDir: n.cfg.PinDir, NoIdentityOption: n.cfg.NoIdentityOption,
		ExternalServices: n.cfg.KubeProxyReplacement, HashSeed: n.cfg.HashSeed})
	if err != nil {
		return err
	}
	n.endpoints = endpointMap{n.progs.Endpoints}
	n.tunnels = tunnelMap{n.progs.Tunnels}
	n.peerNodes = peerNodeMap{n.progs.PeerNodes}
	if err := n.SetFlowEvents(!n.cfg.NoFlowEvents); err != nil {
		return err
	}

	links := filepath.Join(n.cfg.PinDir, "devices")
	if n.cfg.Mode == ModeVXLAN {
		if err := attachPinned(n.progs.FromOverlay, overlayIfindex, ebpf.AttachTCXIngress, filepath.Join(links, OverlayDevice+"_ingress")); err != nil {
			return err
		}
		if err := attachPinned(n.progs.ToOverlay, overlayIfindex, ebpf.AttachTCXEgress, filepath.Join(links, OverlayDevice+"_egress")); err != nil {
			return err
		}
	}
	// Both modes: the underlay is where a host that is no node, or a
	// node that is not the owner, would speak as a pod (host.c).
	if err := attachPinned(n.progs.FromNetdev, under.Attrs().Index, ebpf.AttachTCXIngress, filepath.Join(links, n.cfg.UnderlayDev+"_ingress")); err != nil {
		return err
	}
	// Replies of Services reached from outside leave through it
	// (nodeport.h); without them, every packet the node sends is spared.
	egress := filepath.Join(links, n.cfg.UnderlayDev+"_egress")
	if n.cfg.KubeProxyReplacement {
		if err := attachPinned(n.progs.ToNetdev, under.Attrs().Index, ebpf.AttachTCXEgress, egress); err != nil {
			return err
		}
	} else if err := detachPinned(egress); err != nil {
		return err
	}
	if err := n.attachSockets(); err != nil {
		return err
	}
	// The L7 socket path: connections policy restricts to HTTP rules are
	// read before their server sees a byte (docs/l7.md).
	if err := n.SetupL7(); err != nil {
		return err
	}
	if err := n.setNodeSockets(n.cfg.KubeProxyReplacement); err != nil {
		return err
	}
	return installMasquerade(n.cfg.PodCIDR, n.cfg.ClusterCIDR, n.cfg.NodeIP, nil)
}

func (n *Node) ensureVXLAN(mtu int) (netlink.Link, error) {
	if l, err := n.nl.LinkByName(OverlayDevice); err == nil {
		if vx, ok := l.(*netlink.Vxlan); ok && l.Attrs().MTU == mtu && vx.Port == int(n.cfg.OverlayPort()) {
			return l, n.nl.LinkSetUp(l)
		}
		if err := n.nl.LinkDel(l); err != nil {
			return nil, fmt.Errorf("replace %s: %w", OverlayDevice, err)
		}
	}
	vx := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: OverlayDevice, MTU: mtu, Flags: net.FlagUp},
		FlowBased: true, // collect metadata: the datapath sets the tunnel key
		Port:      int(n.cfg.OverlayPort()),
		Learning:  false,
	}
	if err := n.nl.LinkAdd(vx); err != nil {
		return nil, fmt.Errorf("create %s: %w", OverlayDevice, err)
	}
	l, err := n.nl.LinkByName(OverlayDevice)
	if err != nil {
		return nil, fmt.Errorf("find %s: %w", OverlayDevice, err)
	}
	// No ARP on the overlay: neighbours resolve to the device's own MAC and
	// from_overlay on the far side accepts any destination MAC.
	if err := n.nl.LinkSetARPOff(l); err != nil {
		return nil, fmt.Errorf("disable ARP on %s: %w", OverlayDevice, err)
	}
	if err := n.nl.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("set %s up: %w", OverlayDevice, err)
	}
	return l, nil
}

// PodMTU is the MTU pods get: the underlay's, less the overlay's overhead.
func (n *Node) PodMTU() int { return n.podMTU }

// MapMigrationNotes says what setting up did to pinned maps an earlier
// version left (none when they were this version's).
func (n *Node) MapMigrationNotes() []string { return n.progs.MigrationNotes() }

// FinishMapMigration copies into maps carried over from an earlier
// version what its programs wrote until every link ran this version's;
// call it once the endpoints are adopted. It returns the entries copied.
func (n *Node) FinishMapMigration() (int, error) { return n.progs.FinishMigration() }

// Config returns the config the node was set up with.
func (n *Node) Config() NodeConfig { return n.cfg }

// Metrics returns the datapath's packet counters summed over CPUs.
func (n *Node) Metrics() (map[string]uint64, error) { return readMetrics(n.progs.Metrics) }

// Endpoints lists the endpoint map.
func (n *Node) Endpoints() ([]EndpointEntry, error) { return n.endpoints.list() }

// Close releases the agent's handles. The datapath keeps running: maps and
// links are pinned.
func (n *Node) Close() {
	n.closeTrace()
	if n.progs != nil {
		n.progs.Close()
	}
	if n.l7objs != nil {
		n.l7objs.Close() // pinned: the sockets and their state stay
	}
	if n.nl != nil {
		n.nl.Close()
	}
	if n.nodeNS != nil {
		n.nodeNS.Close()
	}
}

// do runs f in the node's namespace. Kernel calls that resolve an ifindex
// or a sysctl through the calling thread (tcx attach, /proc/sys/net) go
// through it; netlink calls use n.nl, which is bound to the namespace.
func (n *Node) do(f func() error) error {
	if n.nodeNS == nil {
		return f()
	}
	return n.nodeNS.Do(func(ns.NetNS) error { return f() })
}

func (n *Node) routeSrc(a netip.Addr) net.IP {
	if a.Is4() == n.cfg.NodeIP.Is4() {
		return net.IP(n.cfg.NodeIP.AsSlice())
	}
	return nil
}

// RemoveNode deletes what SetupNode made that does not go away with the
// node's namespace: pins, and in the caller's own namespace the overlay
// device and the masquerade table. Endpoints must be removed first.
func RemoveNode(cfg NodeConfig) error {
	var errs []error
	if cfg.NetNS == "" {
		if l, err := netlink.LinkByName(OverlayDevice); err == nil {
			errs = append(errs, netlink.LinkDel(l))
		}
		errs = append(errs, removeMasquerade())
	}
	if err := os.RemoveAll(cfg.PinDir); err != nil {
		errs = append(errs, fmt.Errorf("remove pins %s: %w", cfg.PinDir, err))
	}
	return errors.Join(errs...)
}

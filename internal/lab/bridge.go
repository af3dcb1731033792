package lab

import (
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// CNI names the plugin a lab's pods are attached with.
const (
	CNIWeir   = "weir"
	CNIBridge = "bridge" // reference bridge + host-local, VXLAN between nodes as Flannel does
	// CNINone is a Kubernetes lab without any CNI: its nodes register but
	// stay NotReady until an operator installs one (Weir's chart, as the
	// README's "Install on your cluster" says).
	CNINone = "none"
)

// flannelVXLAN is the reference baseline's overlay device, built the way
// Flannel's vxlan backend builds it: a VTEP per node with static FDB and
// neighbour entries for every other node, and a route per remote pod CIDR.
const (
	flannelDevice = "flannel.1"
	flannelVNI    = 1
	flannelPort   = 8472
)

func vtepMAC(i int) net.HardwareAddr { return net.HardwareAddr{0x02, 0xf1, 0, 0, 0, byte(i)} }

// setupBridgeNode prepares node i (1-based) of a bridge-baseline lab.
func (st *State) setupBridgeNode(i int) error {
	n := st.Nodes[i-1]
	return inNS(n.NetNS, func() error {
		for k, v := range map[string]string{"ipv4/ip_forward": "1", "ipv4/conf/all/rp_filter": "0", "ipv4/conf/default/rp_filter": "0"} {
			if err := os.WriteFile("/proc/sys/net/"+k, []byte(v), 0o644); err != nil {
				return fmt.Errorf("sysctl %s: %w", k, err)
			}
		}
		under, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		vx := &netlink.Vxlan{
			LinkAttrs:    netlink.LinkAttrs{Name: flannelDevice, MTU: under.Attrs().MTU - 50, HardwareAddr: vtepMAC(i)},
			VxlanId:      flannelVNI,
			VtepDevIndex: under.Attrs().Index,
			SrcAddr:      net.IP(n.IP.AsSlice()),
			Port:         flannelPort,
			Learning:     false,
		}
		if err := netlink.LinkAdd(vx); err != nil {
			return fmt.Errorf("create %s: %w", flannelDevice, err)
		}
		dev, err := netlink.LinkByName(flannelDevice)
		if err != nil {
			return err
		}
		self := n.PodCIDR.Addr()
		if err := netlink.AddrAdd(dev, &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(self.AsSlice()), Mask: net.CIDRMask(32, 32)}}); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(dev); err != nil {
			return err
		}
		for j, peer := range st.Nodes {
			if peer.Name == n.Name {
				continue
			}
			if err := flannelPeer(dev, peer.PodCIDR, peer.IP, vtepMAC(j+1)); err != nil {
				return fmt.Errorf("peer %s: %w", peer.Name, err)
			}
		}
		return nil
	})
}

func flannelPeer(dev netlink.Link, cidr netip.Prefix, nodeIP netip.Addr, mac net.HardwareAddr) error {
	gw := net.IP(cidr.Addr().AsSlice())
	idx := dev.Attrs().Index
	if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_INET, State: netlink.NUD_PERMANENT, IP: gw, HardwareAddr: mac}); err != nil {
		return fmt.Errorf("neighbour: %w", err)
	}
	if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, State: netlink.NUD_PERMANENT, IP: net.IP(nodeIP.AsSlice()), HardwareAddr: mac}); err != nil {
		return fmt.Errorf("fdb: %w", err)
	}
	dst := &net.IPNet{IP: gw, Mask: net.CIDRMask(cidr.Bits(), 32)}
	if err := netlink.RouteReplace(&netlink.Route{LinkIndex: idx, Dst: dst, Gw: gw, Flags: int(netlink.FLAG_ONLINK)}); err != nil {
		return fmt.Errorf("route: %w", err)
	}
	return nil
}

// bridgeConfList is the reference plugins' config for node n.
func bridgeConfList(st *State, n *Node) string {
	return fmt.Sprintf(`{"cniVersion":"1.1.0","name":"bridge-ref","plugins":[{"type":"bridge","bridge":"cni0","isGateway":true,"isDefaultGateway":true,"ipMasq":false,"mtu":1450,`+
		`"ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],"dataDir":%q}}]}`, n.PodCIDR.String(), n.StateDir+"/host-local")
}

package lab

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// Underlay addressing of every lab: nodes at .11, .12, ..., the outside host
// at .200. The subnet exists only inside the lab's namespaces.
var (
	underlayNet = netip.MustParsePrefix("10.99.0.0/24")
	extHostIP   = netip.MustParseAddr("10.99.0.200")
)

const bridgeName = "br0"

// nodeIP is the underlay address of node i (1-based).
func nodeIP(i int) netip.Addr {
	b := underlayNet.Addr().As4()
	b[3] = byte(10 + i)
	return netip.AddrFrom4(b)
}

// podCIDR is node i's slice of the cluster CIDR: 10.244.i.0/24.
func podCIDR(cluster netip.Prefix, i int) netip.Prefix {
	b := cluster.Addr().As4()
	b[2] = byte(i)
	return netip.PrefixFrom(netip.AddrFrom4(b), 24)
}

// buildUnderlay creates the underlay namespace with its bridge.
func buildUnderlay(ulNS string) error {
	if err := createNetNS(ulNS); err != nil {
		return err
	}
	return inNS(ulNS, func() error {
		if err := setUp("lo"); err != nil {
			return err
		}
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeName}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("create bridge: %w", err)
		}
		return setUp(bridgeName)
	})
}

// plugHost creates host namespace name, wires its eth0 to the underlay
// bridge through port, and gives it addr. Hosts get no default route: the
// lab must never send anything off this machine.
func plugHost(ulNS, name, port string, addr netip.Addr) error {
	if err := createNetNS(name); err != nil {
		return err
	}
	hostNS, err := ns.GetNS(nsPath(name))
	if err != nil {
		return err
	}
	defer hostNS.Close()
	err = inNS(ulNS, func() error {
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: port, MTU: 1500},
			PeerName:      "eth0",
			PeerNamespace: netlink.NsFd(int(hostNS.Fd())),
		}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("create underlay port %s: %w", port, err)
		}
		l, err := netlink.LinkByName(port)
		if err != nil {
			return err
		}
		br, err := netlink.LinkByName(bridgeName)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(l, br); err != nil {
			return fmt.Errorf("attach %s to bridge: %w", port, err)
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		return err
	}
	return inNS(name, func() error {
		if err := setUp("lo"); err != nil {
			return err
		}
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		ipn := &net.IPNet{IP: net.IP(addr.AsSlice()), Mask: net.CIDRMask(underlayNet.Bits(), 32)}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipn}); err != nil {
			return fmt.Errorf("address %s: %w", name, err)
		}
		return netlink.LinkSetUp(l)
	})
}

// inNS runs f inside the named namespace on a locked thread.
func inNS(name string, f func() error) error { return InNS(nsPath(name), f) }

func setUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	return nil
}

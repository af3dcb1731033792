package lab

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// VethPair is the physical limit of this machine for pod-to-pod traffic:
// two namespaces joined by one veth pair, nothing else on the path.
type VethPair struct {
	Name         string
	NSA, NSB     string // namespace paths
	AddrA, AddrB netip.Addr
}

// UpVethPair creates <name>-a and <name>-b joined by a veth pair with the
// given MTU. Down(name) removes them.
func UpVethPair(name string, mtu int) (_ *VethPair, retErr error) {
	p := &VethPair{
		Name: name, NSA: nsPath(name + "-a"), NSB: nsPath(name + "-b"),
		AddrA: netip.MustParseAddr("10.98.0.1"), AddrB: netip.MustParseAddr("10.98.0.2"),
	}
	defer func() {
		if retErr != nil {
			deleteNetNS(name + "-a")
			deleteNetNS(name + "-b")
		}
	}()
	for _, n := range []string{name + "-a", name + "-b"} {
		if err := createNetNS(n); err != nil {
			return nil, err
		}
	}
	b, err := ns.GetNS(p.NSB)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	err = inNS(name+"-a", func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", MTU: mtu}, PeerName: "eth0", PeerMTU: uint32(mtu), PeerNamespace: netlink.NsFd(int(b.Fd()))}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("create veth pair: %w", err)
		}
		return addrUp("eth0", p.AddrA)
	})
	if err != nil {
		return nil, err
	}
	return p, inNS(name+"-b", func() error { return addrUp("eth0", p.AddrB) })
}

func addrUp(dev string, a netip.Addr) error {
	if err := setUp("lo"); err != nil {
		return err
	}
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(24, 32)}}); err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}

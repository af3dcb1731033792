package datapath

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ErrNetNSNotFound is returned when a pod's network namespace does not exist.
var ErrNetNSNotFound = errors.New("network namespace not found")

// ErrInterfaceExists is returned when the pod already has an interface of the requested name.
var ErrInterfaceExists = errors.New("interface already exists in the pod")

// EndpointSpec describes the network attachment of one pod interface.
type EndpointSpec struct {
	ContainerID string
	IfName      string // name inside the pod, e.g. eth0
	NetNS       string // path of the pod's network namespace
	Addr        netip.Prefix
	Gateway     netip.Addr
	MTU         int
}

// HostIfName is the node-side veth name: stable for a (container, ifname)
// attachment, so DEL and GC find it again without any stored state.
func (s EndpointSpec) HostIfName() string { return HostIfName(s.ContainerID, s.IfName) }

// HostIfName derives the node-side veth name of an attachment.
func HostIfName(containerID, ifName string) string {
	sum := sha256.Sum256([]byte(containerID + "/" + ifName))
	return HostIfPrefix + hex.EncodeToString(sum[:])[:15-len(HostIfPrefix)]
}

// HostIfPrefix starts the name of every pod veth Weir creates on a node.
const HostIfPrefix = "weir"

// IsHostIfName reports whether name has the shape of a pod veth name
// (HostIfPrefix and hex digits, 15 bytes), which no node device shares.
func IsHostIfName(name string) bool {
	if len(name) != 15 || !strings.HasPrefix(name, HostIfPrefix) {
		return false
	}
	_, err := hex.DecodeString(name[len(HostIfPrefix):] + "0")
	return err == nil
}

// Endpoint is a plumbed attachment.
type Endpoint struct {
	Spec        EndpointSpec
	HostIfindex int
	HostMAC     net.HardwareAddr
	PodMAC      net.HardwareAddr
}

func (e *Endpoint) entry() EndpointEntry {
	return EndpointEntry{Addr: e.Spec.Addr.Addr(), HostIfindex: e.HostIfindex, PodMAC: e.PodMAC, HostMAC: e.HostMAC}
}

// CreateVeth creates the veth pair, the pod end directly inside the pod's
// namespace under its final name.
func (n *Node) CreateVeth(spec EndpointSpec) (*Endpoint, error) {
	if spec.MTU == 0 {
		spec.MTU = n.podMTU
	}
	podNS, err := getNS(spec.NetNS)
	if err != nil {
		return nil, err
	}
	defer podNS.Close()

	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: spec.HostIfName(), MTU: spec.MTU},
		PeerName:      spec.IfName,
		PeerMTU:       uint32(spec.MTU),
		PeerNamespace: netlink.NsFd(int(podNS.Fd())),
	}
	if err := n.nl.LinkAdd(veth); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create veth %s/%s: %w", veth.Name, spec.IfName, ErrInterfaceExists)
		}
		return nil, fmt.Errorf("create veth %s/%s: %w", veth.Name, spec.IfName, err)
	}
	host, err := n.nl.LinkByName(veth.Name)
	if err != nil {
		return nil, fmt.Errorf("find new veth %s: %w", veth.Name, err)
	}
	return &Endpoint{Spec: spec, HostIfindex: host.Attrs().Index, HostMAC: host.Attrs().HardwareAddr}, nil
}

// ConfigurePod addresses the pod end and routes everything through the
// gateway, which the datapath's ARP responder answers.
func (n *Node) ConfigurePod(ep *Endpoint) error {
	podNS, err := getNS(ep.Spec.NetNS)
	if err != nil {
		return err
	}
	defer podNS.Close()
	return podNS.Do(func(ns.NetNS) error {
		if lo, err := netlink.LinkByName("lo"); err == nil {
			if err := netlink.LinkSetUp(lo); err != nil {
				return fmt.Errorf("set lo up: %w", err)
			}
		}
		l, err := netlink.LinkByName(ep.Spec.IfName)
		if err != nil {
			return fmt.Errorf("find %s in pod: %w", ep.Spec.IfName, err)
		}
		addr := &netlink.Addr{IPNet: prefixIPNet(netip.PrefixFrom(ep.Spec.Addr.Addr(), ep.Spec.Addr.Addr().BitLen()))}
		if err := netlink.AddrReplace(l, addr); err != nil {
			return fmt.Errorf("add address %v to %s: %w", ep.Spec.Addr, ep.Spec.IfName, err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", ep.Spec.IfName, err)
		}
		gw := prefixIPNet(netip.PrefixFrom(ep.Spec.Gateway, ep.Spec.Gateway.BitLen()))
		if err := netlink.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: gw, Scope: netlink.SCOPE_LINK}); err != nil {
			return fmt.Errorf("add gateway route: %w", err)
		}
		def := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: defaultRoute(ep.Spec.Gateway), Gw: net.IP(ep.Spec.Gateway.AsSlice()), MTU: ep.Spec.MTU}
		if err := netlink.RouteReplace(def); err != nil {
			return fmt.Errorf("add default route: %w", err)
		}
		ep.PodMAC = l.Attrs().HardwareAddr
		return nil
	})
}

// ConfigureHost brings the node end up and routes the pod address to it,
// with a permanent neighbour entry so the node never ARPs for its pods.
func (n *Node) ConfigureHost(ep *Endpoint) error {
	host, err := n.nl.LinkByIndex(ep.HostIfindex)
	if err != nil {
		return fmt.Errorf("find host veth %d: %w", ep.HostIfindex, err)
	}
	// Before the link is up: no router advertisement a pod sends may
	// ever configure the node (podlink.h drops them too).
	if err := n.do(func() error { return n.sysctls().setHostVethSysctls(host.Attrs().Name) }); err != nil {
		return err
	}
	if err := n.nl.LinkSetUp(host); err != nil {
		return fmt.Errorf("set %s up: %w", host.Attrs().Name, err)
	}
	ip := net.IP(ep.Spec.Addr.Addr().AsSlice())
	neigh := &netlink.Neigh{LinkIndex: ep.HostIfindex, IP: ip, HardwareAddr: ep.PodMAC, State: netlink.NUD_PERMANENT, Family: family(ep.Spec.Addr.Addr())}
	if err := n.nl.NeighSet(neigh); err != nil {
		return fmt.Errorf("add neighbour %v on %s: %w", ip, host.Attrs().Name, err)
	}
	dst := prefixIPNet(netip.PrefixFrom(ep.Spec.Addr.Addr(), ep.Spec.Addr.Addr().BitLen()))
	route := &netlink.Route{LinkIndex: ep.HostIfindex, Dst: dst, Scope: netlink.SCOPE_LINK, Src: n.routeSrc(ep.Spec.Addr.Addr())}
	if err := n.nl.RouteReplace(route); err != nil {
		return fmt.Errorf("add route %v dev %s: %w", dst, host.Attrs().Name, err)
	}
	return nil
}

// AttachProgram attaches from_container and to_container to the node end
// and pins the links, so the programs outlive the agent process.
func (n *Node) AttachProgram(ep *Endpoint) error {
	return n.do(func() error {
		if err := attachPinned(n.progs.ToContainer, ep.HostIfindex, ebpf.AttachTCXEgress, n.endpointEgressPin(ep.Spec.HostIfName())); err != nil {
			return err
		}
		return attachPinned(n.progs.FromContainer, ep.HostIfindex, ebpf.AttachTCXIngress, n.endpointPin(ep.Spec.HostIfName()))
	})
}

// Publish makes the endpoint reachable: the map entry is written last, once
// everything it points to exists. Before it, the pod's namespace is
// registered for Service translation at the socket.
func (n *Node) Publish(ep *Endpoint) error {
	cookie, err := netnsCookie(ep.Spec.NetNS)
	if err != nil {
		return err
	}
	if err := n.progs.SockNetNS.Put(cookie, uint32(ep.HostIfindex)); err != nil {
		return fmt.Errorf("register netns of %s for service translation: %w", ep.Spec.HostIfName(), err)
	}
	return n.endpoints.put(ep.entry())
}

// RemoveEndpoint tears an attachment down in reverse order. It is
// idempotent and tolerates every partial state CreateVeth..Publish can
// leave, so it is also the rollback of a failed ADD.
func (n *Node) RemoveEndpoint(spec EndpointSpec) error {
	var errs []error
	hostName := spec.HostIfName()
	host, linkErr := n.nl.LinkByName(hostName)
	if spec.Addr.IsValid() {
		// Only remove the map entry if it points at this attachment's veth
		// (or at no live veth): never unpublish another pod's address.
		e, ok, err := n.endpoints.lookup(spec.Addr.Addr())
		switch {
		case err != nil:
			errs = append(errs, err)
		case ok && (linkErr != nil || e.HostIfindex == host.Attrs().Index || !n.ifindexAlive(e.HostIfindex)):
			errs = append(errs, n.endpoints.delete(spec.Addr.Addr()))
		}
	}
	if linkErr == nil {
		idx := host.Attrs().Index
		errs = append(errs, n.forgetNetNS(func(i int) bool { return i == idx }))
		// The flags die with the veth; its allow keys go when the pod
		// leaves the compiled state.
		errs = append(errs, ignoreNotExist(n.writePolicyMap(func() error { return n.progs.EpPolicy.Delete(uint32(idx)) })))
		// Deleting one end removes the pair, its routes and neighbours, and
		// detaches the program with it.
		if err := n.nl.LinkDel(host); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("delete veth %s: %w", hostName, err))
		}
	} else if !isLinkNotFound(linkErr) {
		errs = append(errs, fmt.Errorf("find veth %s: %w", hostName, linkErr))
	}
	// Unpinning after the veth is gone releases a link the kernel has
	// already detached; unpinning first would wait out one more RCU grace
	// period for a detach the device deletion does anyway.
	errs = append(errs, detachPinned(n.endpointPin(hostName)), detachPinned(n.endpointEgressPin(hostName)))
	return errors.Join(errs...)
}

// CheckEndpoint verifies that an attachment is fully in place.
func (n *Node) CheckEndpoint(spec EndpointSpec) error {
	host, err := n.nl.LinkByName(spec.HostIfName())
	if err != nil {
		return fmt.Errorf("host veth %s: %w", spec.HostIfName(), err)
	}
	e, ok, err := n.endpoints.lookup(spec.Addr.Addr())
	if err != nil {
		return err
	}
	if !ok || e.HostIfindex != host.Attrs().Index {
		return fmt.Errorf("endpoint map has no entry for %v on %s", spec.Addr.Addr(), spec.HostIfName())
	}
	podNS, err := getNS(spec.NetNS)
	if err != nil {
		return err
	}
	defer podNS.Close()
	return podNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(spec.IfName)
		if err != nil {
			return fmt.Errorf("%s in pod: %w", spec.IfName, err)
		}
		addrs, err := netlink.AddrList(l, family(spec.Addr.Addr()))
		if err != nil {
			return fmt.Errorf("list addresses of %s: %w", spec.IfName, err)
		}
		for _, a := range addrs {
			if a.IP.Equal(net.IP(spec.Addr.Addr().AsSlice())) {
				return nil
			}
		}
		return fmt.Errorf("%s in pod lacks address %v", spec.IfName, spec.Addr.Addr())
	})
}

func (n *Node) endpointPin(hostIfName string) string {
	return filepath.Join(n.cfg.PinDir, "links", hostIfName)
}

func (n *Node) endpointEgressPin(hostIfName string) string {
	return filepath.Join(n.cfg.PinDir, "links-egress", hostIfName)
}

func (n *Node) ifindexAlive(idx int) bool {
	_, err := n.nl.LinkByIndex(idx)
	return err == nil
}

func getNS(path string) (ns.NetNS, error) {
	podNS, err := ns.GetNS(path)
	if err != nil {
		var notExist ns.NSPathNotExistErr
		if errors.As(err, &notExist) {
			return nil, fmt.Errorf("%s: %w", path, ErrNetNSNotFound)
		}
		return nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	return podNS, nil
}

func isLinkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

func prefixIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func defaultRoute(like netip.Addr) *net.IPNet {
	if like.Is4() {
		return prefixIPNet(netip.PrefixFrom(netip.IPv4Unspecified(), 0))
	}
	return prefixIPNet(netip.PrefixFrom(netip.IPv6Unspecified(), 0))
}

func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

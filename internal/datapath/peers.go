package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// Peer is another node of the cluster as the datapath needs it.
type Peer struct {
	Name    string
	NodeIP  netip.Addr
	PodCIDR netip.Prefix
}

// SetPeers makes the tunnel map and the node's routes match peers exactly:
// new peers are added, changed ones updated, vanished ones removed. The map
// steers pod traffic; the routes carry what the node itself sends to remote
// pods (and, in native mode, give from_container's FIB lookup its answer).
func (n *Node) SetPeers(peers []Peer) error {
	want := make(map[netip.Prefix]netip.Addr, len(peers))
	for _, p := range peers {
		if p.PodCIDR == n.cfg.PodCIDR || p.NodeIP == n.cfg.NodeIP {
			continue // ourselves
		}
		if !p.PodCIDR.IsValid() || !p.NodeIP.IsValid() {
			return fmt.Errorf("peer %q: pod CIDR and node IP are required", p.Name)
		}
		want[p.PodCIDR.Masked()] = p.NodeIP
	}
	// Peer nodes first: a node's pod addresses are accepted from the
	// overlay only once the node is a peer, and a departed node stops
	// being one before its pods' addresses stop being pods.
	if err := n.setPeerNodes(want); err != nil {
		return err
	}
	have, err := n.tunnels.list()
	if err != nil {
		return err
	}
	var errs []error
	for cidr, node := range want {
		if err := n.routePeer(cidr, node); err != nil {
			errs = append(errs, err)
			continue
		}
		if have[cidr] != node {
			errs = append(errs, n.tunnels.put(cidr, node))
		}
	}
	for cidr := range have {
		if _, ok := want[cidr]; !ok {
			errs = append(errs, n.tunnels.delete(cidr))
		}
	}
	errs = append(errs, n.pruneRoutes(want))
	nodes := make([]netip.Addr, 0, len(want))
	for _, ip := range want {
		nodes = append(nodes, ip)
	}
	errs = append(errs, n.do(func() error { return installMasquerade(n.cfg.PodCIDR, n.cfg.ClusterCIDR, n.cfg.NodeIP, nodes) }))
	return errors.Join(errs...)
}

// setPeerNodes makes weir_peer_nodes hold exactly the nodes of want.
func (n *Node) setPeerNodes(want map[netip.Prefix]netip.Addr) error {
	nodes := map[netip.Addr]bool{}
	for _, ip := range want {
		nodes[ip] = true
	}
	have, err := n.peerNodes.list()
	if err != nil {
		return err
	}
	var errs []error
	for ip := range have {
		if !nodes[ip] {
			errs = append(errs, n.peerNodes.delete(ip))
		}
	}
	for ip := range nodes {
		if !have[ip] {
			errs = append(errs, n.peerNodes.put(ip))
		}
	}
	return errors.Join(errs...)
}

// routePeer installs the route to one remote pod CIDR.
func (n *Node) routePeer(cidr netip.Prefix, node netip.Addr) error {
	r := &netlink.Route{Dst: prefixIPNet(cidr), Protocol: routeProtocol, Src: n.routeSrc(cidr.Addr())}
	if n.cfg.Mode == ModeVXLAN {
		vx, err := n.nl.LinkByName(OverlayDevice)
		if err != nil {
			return fmt.Errorf("find %s: %w", OverlayDevice, err)
		}
		r.LinkIndex, r.Scope = vx.Attrs().Index, netlink.SCOPE_LINK
	} else {
		under, err := n.nl.LinkByName(n.cfg.UnderlayDev)
		if err != nil {
			return fmt.Errorf("find %s: %w", n.cfg.UnderlayDev, err)
		}
		r.LinkIndex, r.Gw = under.Attrs().Index, net.IP(node.AsSlice())
	}
	if err := n.nl.RouteReplace(r); err != nil {
		return fmt.Errorf("route %v to node %v: %w", cidr, node, err)
	}
	return nil
}

// pruneRoutes deletes Weir's routes to CIDRs no peer owns any more.
func (n *Node) pruneRoutes(want map[netip.Prefix]netip.Addr) error {
	routes, err := n.nl.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: routeProtocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return fmt.Errorf("list routes: %w", err)
	}
	var errs []error
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		a, _ := netip.AddrFromSlice(r.Dst.IP)
		if _, ok := want[netip.PrefixFrom(a.Unmap(), ones)]; ok {
			continue
		}
		if err := n.nl.RouteDel(&r); err != nil {
			errs = append(errs, fmt.Errorf("delete route %v: %w", r.Dst, err))
		}
	}
	return errors.Join(errs...)
}

package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"
)

// afInet and afInet6 are the family bytes of struct weir_addr (bpf/lib/addr.h).
const (
	afInet  = 2
	afInet6 = 10
)

// tunnelKeyPrefixBits is TUNNEL_KEY_PREFIX_BITS in bpf/lib/tunnel.h: the
// family and padding that precede the address in an LPM key.
const tunnelKeyPrefixBits = 32

// ErrUnsupportedFamily is returned for an address that is neither IPv4 nor IPv6.
var ErrUnsupportedFamily = errors.New("unsupported address family")

// bpfAddr converts an address into the family-tagged layout of map keys.
func bpfAddr(a netip.Addr) (lxcWeirAddr, error) {
	var out lxcWeirAddr
	switch {
	case a.Is4():
		out.Family = afInet
		b := a.As4()
		copy(out.Addr[:], b[:])
	case a.Is6():
		out.Family = afInet6
		out.Addr = a.As16()
	default:
		return out, fmt.Errorf("address %v: %w", a, ErrUnsupportedFamily)
	}
	return out, nil
}

// addrFromBPF is the inverse of bpfAddr.
func addrFromBPF(a lxcWeirAddr) (netip.Addr, error) {
	switch a.Family {
	case afInet:
		return netip.AddrFrom4([4]byte(a.Addr[:4])), nil
	case afInet6:
		return netip.AddrFrom16(a.Addr), nil
	}
	return netip.Addr{}, fmt.Errorf("family %d: %w", a.Family, ErrUnsupportedFamily)
}

// tunnelKey builds the LPM key for a prefix.
func tunnelKey(p netip.Prefix) (lxcTunnelKey, error) {
	a, err := bpfAddr(p.Masked().Addr())
	if err != nil {
		return lxcTunnelKey{}, err
	}
	return lxcTunnelKey{Prefixlen: uint32(tunnelKeyPrefixBits + p.Bits()), Dst: a}, nil
}

// EndpointEntry is one local pod address as the datapath sees it.
type EndpointEntry struct {
	Addr        netip.Addr
	HostIfindex int
	PodMAC      net.HardwareAddr
	HostMAC     net.HardwareAddr
}

func (e EndpointEntry) value() lxcEndpointInfo {
	var v lxcEndpointInfo
	v.Ifindex = uint32(e.HostIfindex)
	copy(v.Mac[:], e.PodMAC)
	copy(v.NodeMac[:], e.HostMAC)
	return v
}

// endpointMap wraps weir_endpoints.
type endpointMap struct{ m *ebpf.Map }

func (em endpointMap) put(e EndpointEntry) error {
	k, err := bpfAddr(e.Addr)
	if err != nil {
		return err
	}
	if err := em.m.Put(&k, e.value()); err != nil {
		return fmt.Errorf("update endpoint map for %v: %w", e.Addr, err)
	}
	return nil
}

// delete removes an address; a missing entry is not an error.
func (em endpointMap) delete(a netip.Addr) error {
	k, err := bpfAddr(a)
	if err != nil {
		return err
	}
	if err := em.m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete endpoint map entry %v: %w", a, err)
	}
	return nil
}

func (em endpointMap) lookup(a netip.Addr) (EndpointEntry, bool, error) {
	k, err := bpfAddr(a)
	if err != nil {
		return EndpointEntry{}, false, err
	}
	var v lxcEndpointInfo
	if err := em.m.Lookup(&k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return EndpointEntry{}, false, nil
		}
		return EndpointEntry{}, false, fmt.Errorf("lookup endpoint %v: %w", a, err)
	}
	return entryFromValue(a, v), true, nil
}

func entryFromValue(a netip.Addr, v lxcEndpointInfo) EndpointEntry {
	return EndpointEntry{
		Addr:        a,
		HostIfindex: int(v.Ifindex),
		PodMAC:      net.HardwareAddr(append([]byte(nil), v.Mac[:]...)),
		HostMAC:     net.HardwareAddr(append([]byte(nil), v.NodeMac[:]...)),
	}
}

// list returns every entry in the map.
func (em endpointMap) list() ([]EndpointEntry, error) {
	var (
		k   lxcWeirAddr
		v   lxcEndpointInfo
		out []EndpointEntry
	)
	it := em.m.Iterate()
	for it.Next(&k, &v) {
		a, err := addrFromBPF(k)
		if err != nil {
			return nil, err
		}
		out = append(out, entryFromValue(a, v))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate endpoint map: %w", err)
	}
	return out, nil
}

// peerNodeMap wraps weir_peer_nodes: the underlay addresses that may
// send into the overlay.
type peerNodeMap struct{ m *ebpf.Map }

func (pm peerNodeMap) put(a netip.Addr) error {
	k, err := bpfAddr(a)
	if err != nil {
		return err
	}
	if err := pm.m.Put(&k, uint32(0)); err != nil {
		return fmt.Errorf("add peer node %v: %w", a, err)
	}
	return nil
}

func (pm peerNodeMap) delete(a netip.Addr) error {
	k, err := bpfAddr(a)
	if err != nil {
		return err
	}
	if err := pm.m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete peer node %v: %w", a, err)
	}
	return nil
}

func (pm peerNodeMap) list() (map[netip.Addr]bool, error) {
	var (
		k   lxcWeirAddr
		v   uint32
		out = map[netip.Addr]bool{}
	)
	it := pm.m.Iterate()
	for it.Next(&k, &v) {
		a, err := addrFromBPF(k)
		if err != nil {
			return nil, err
		}
		out[a] = true
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate peer node map: %w", err)
	}
	return out, nil
}

// tunnelMap wraps weir_tunnels.
type tunnelMap struct{ m *ebpf.Map }

func (tm tunnelMap) put(cidr netip.Prefix, node netip.Addr) error {
	k, err := tunnelKey(cidr)
	if err != nil {
		return err
	}
	n, err := bpfAddr(node)
	if err != nil {
		return err
	}
	if err := tm.m.Put(&k, lxcTunnelInfo{Node: n}); err != nil {
		return fmt.Errorf("update tunnel map %v -> %v: %w", cidr, node, err)
	}
	return nil
}

func (tm tunnelMap) delete(cidr netip.Prefix) error {
	k, err := tunnelKey(cidr)
	if err != nil {
		return err
	}
	if err := tm.m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete tunnel map entry %v: %w", cidr, err)
	}
	return nil
}

// list returns CIDR → node address for every entry.
func (tm tunnelMap) list() (map[netip.Prefix]netip.Addr, error) {
	var (
		k   lxcTunnelKey
		v   lxcTunnelInfo
		out = map[netip.Prefix]netip.Addr{}
	)
	it := tm.m.Iterate()
	for it.Next(&k, &v) {
		a, err := addrFromBPF(k.Dst)
		if err != nil {
			return nil, err
		}
		n, err := addrFromBPF(v.Node)
		if err != nil {
			return nil, err
		}
		out[netip.PrefixFrom(a, int(k.Prefixlen)-tunnelKeyPrefixBits)] = n
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate tunnel map: %w", err)
	}
	return out, nil
}

// Metric names, indexed as enum weir_metric in bpf/lib/metrics.h.
var MetricNames = []string{
	"redirect_local",
	"redirect_tunnel",
	"redirect_native",
	"pass_host",
	"arp_reply",
	"drop_spoof",
	"drop_malformed",
	"drop_tunnel",
	"pass_stack_nat",
	"drop_policy",
	"ct_new",
	"ct_full",
	"event_lost",
	"sock_lb",
	"sock_lb_miss",
	"policy_reject",
	"drop_ipv6",
	"drop_vlan",
	"drop_ethertype",
	"drop_tunnel_source",
	"drop_no_flow",
	"drop_fragment",
	"ct_related",
	"ct_revoked_full",
	"drop_broadcast",
	"policy_reread",
	"drop_policy_changing",
	"verdict_count_full",
	"identity_option_sent",
	"identity_option_read",
	"drop_identity_option",
	"sock_lb_reject",
	"sock_lb_affinity",
	"sock_lb_closed",
	"nodeport_new",
	"nodeport",
	"nodeport_reply",
	"drop_nodeport",
	"drop_l7_unjoined",
	"drop_l7_not_recorded",
	"drop_l7_unjudged",
}

// readMetrics sums the per-CPU counters.
func readMetrics(m *ebpf.Map) (map[string]uint64, error) {
	out := make(map[string]uint64, len(MetricNames))
	for i, name := range MetricNames {
		var perCPU []uint64
		if err := m.Lookup(uint32(i), &perCPU); err != nil {
			return nil, fmt.Errorf("read metric %s: %w", name, err)
		}
		var sum uint64
		for _, v := range perCPU {
			sum += v
		}
		out[name] = sum
	}
	return out, nil
}

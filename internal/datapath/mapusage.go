package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Names of the maps whose fill MapEntries and MapCapacity report, as
// metrics label them. A full one fails: conntrack evicts live flows (it
// is an LRU hash), the others refuse the policy the agent writes.
const (
	MapConntrack      = "conntrack"             // weir_ct: TCP
	MapConntrackOther = "conntrack_other"       // weir_ct_any: every other protocol
	MapRevokedFlows   = "revoked_flows"         // weir_ct_revoked: full, a revocation rests on the LRU alone
	MapPeerNodes      = "peer_nodes"            // weir_peer_nodes
	MapPolicy         = "policy"                // weir_policy, an LPM trie
	MapEndpointPolicy = "endpoint_policy"       // weir_ep_policy
	MapIPCache        = "ipcache"               // weir_ipcache
	MapCIDRIdentities = "cidr_identities"       // weir_cidr_ids, an LPM trie
	MapFragments      = "fragments"             // weir_frags, an LRU: first fragments' ports
	MapEndpoints      = "endpoints"             // weir_endpoints: local pods
	MapTunnels        = "tunnels"               // weir_tunnels: peers' pod CIDRs
	MapServices       = "services"              // weir_lb4_services: Service frontends
	MapBackends       = "backends"              // weir_lb4_backends: one slot per frontend and backend
	MapRevNAT         = "revnat"                // weir_lb4_revnat: translated sockets
	MapSocketNetNS    = "socket_netns"          // weir_sock_netns: namespaces translated at the socket
	MapAffinity       = "service_affinity"      // weir_lb4_affinity, an LRU: each client's backend of an affinity Service
	MapMembers        = "affinity_members"      // weir_lb4_members: the backends of affinity Services
	MapNAT            = "service_nat"           // weir_lb4_nat_fwd, an LRU: flows from outside to a Service
	MapNATReplies     = "service_nat_replies"   // weir_lb4_nat_rev, an LRU: their replies
	MapMaglev         = "service_maglev"        // weir_lb4_maglev: external frontends' Maglev tables
	MapNATFragments   = "service_nat_fragments" // weir_lb4_frags, an LRU: fragmented datagrams of those flows
	MapServiceFlows   = "service_flows"         // weir_lb4_flows, an LRU: the Service each translated flow went through
)

// FillMaps lists the maps MapEntries knows.
var FillMaps = []string{MapConntrack, MapConntrackOther, MapRevokedFlows, MapFragments, MapPolicy, MapEndpointPolicy,
	MapIPCache, MapCIDRIdentities, MapPeerNodes, MapEndpoints, MapTunnels, MapServices, MapBackends, MapRevNAT, MapAffinity, MapMembers, MapNAT, MapNATReplies, MapMaglev, MapNATFragments, MapSocketNetNS, MapServiceFlows}

// ErrUnknownMap is returned for a name not in FillMaps.
var ErrUnknownMap = errors.New("unknown map")

// countBatch is how many entries one batch lookup asks for: large enough
// for any hash bucket (a smaller batch fails with ENOSPC), small enough
// to keep the buffers a few hundred KiB.
const countBatch = 4096

// MapCapacity returns a map's max_entries.
func (n *Node) MapCapacity(name string) (int, error) {
	m, err := n.fillMap(name)
	if err != nil {
		return 0, err
	}
	return int(m.MaxEntries()), nil
}

// MapEntries counts a map's entries, stopping once it has seen limit
// (0: no limit). The count is a moment's: the datapath adds and evicts
// conntrack entries while it runs. It costs a syscall per batch of
// entries, or per entry on a kernel without batch lookups for the map.
func (n *Node) MapEntries(name string, limit int) (int, error) {
	if _, err := n.fillMap(name); err != nil {
		return 0, err
	}
	p := n.progs
	var (
		count int
		err   error
	)
	switch name {
	case MapConntrack:
		count, err = countEntries[lxcCtKey, lxcCtEntry](p.CT, limit)
	case MapConntrackOther:
		count, err = countEntries[lxcCtKey, lxcCtEntry](p.CTAny, limit)
	case MapRevokedFlows:
		count, err = countEntries[lxcCtKey, uint64](p.CTRevoked, limit)
	case MapPeerNodes:
		count, err = countEntries[lxcWeirAddr, uint32](p.PeerNodes, limit)
	case MapPolicy:
		count, err = countEntries[lxcPolicyKey, lxcPolicyEntry](p.Policy, limit)
	case MapEndpointPolicy:
		count, err = countEntries[uint32, lxcEpPolicy](p.EpPolicy, limit)
	case MapIPCache:
		count, err = countEntries[lxcWeirAddr, uint32](p.IPCache, limit)
	case MapCIDRIdentities:
		count, err = countEntries[lxcCidrKey, uint32](p.CIDRIDs, limit)
	case MapFragments:
		count, err = countEntries[lxcFragKey, lxcFragPorts](p.Frags, limit)
	case MapEndpoints:
		count, err = countEntries[lxcWeirAddr, lxcEndpointInfo](p.Endpoints, limit)
	case MapTunnels:
		count, err = countEntries[lxcTunnelKey, lxcTunnelInfo](p.Tunnels, limit)
	case MapServices:
		count, err = countEntries[sockLb4Key, sockLb4Service](p.LB4Services, limit)
	case MapBackends:
		count, err = countEntries[sockLb4BackendKey, sockLb4Backend](p.LB4Backends, limit)
	case MapRevNAT:
		count, err = countEntries[sockLb4RevnatKey, sockLb4Revnat](p.LB4RevNAT, limit)
	case MapSocketNetNS:
		count, err = countEntries[uint64, uint32](p.SockNetNS, limit)
	case MapAffinity:
		count, err = countEntries[sockLb4AffinityKey, sockLb4Affinity](p.LB4Affinity, limit)
	case MapMembers:
		count, err = countEntries[sockLb4MemberKey, uint32](p.LB4Members, limit)
	case MapNAT:
		count, err = countEntries[hostLb4Tuple, hostLb4Nat](p.LB4NatFwd, limit)
	case MapNATReplies:
		count, err = countEntries[hostLb4Tuple, hostLb4Nat](p.LB4NatRev, limit)
	case MapMaglev:
		count, err = countKeys(p.LB4Maglev, limit) // values are 32 KiB: keys alone
	case MapNATFragments:
		count, err = countEntries[hostLb4FragKey, hostLb4Nat](p.LB4Frags, limit)
	case MapServiceFlows:
		count, err = countEntries[sockLb4FlowKey, sockLb4Flow](p.LB4Flows, limit)
	}
	if err != nil {
		return 0, fmt.Errorf("count entries of map %s: %w", name, err)
	}
	return count, nil
}

func (n *Node) fillMap(name string) (*ebpf.Map, error) {
	p := n.progs
	m := map[string]*ebpf.Map{
		MapConntrack: p.CT, MapConntrackOther: p.CTAny, MapRevokedFlows: p.CTRevoked, MapPeerNodes: p.PeerNodes, MapPolicy: p.Policy, MapEndpointPolicy: p.EpPolicy,
		MapIPCache: p.IPCache, MapCIDRIdentities: p.CIDRIDs, MapFragments: p.Frags, MapEndpoints: p.Endpoints, MapTunnels: p.Tunnels,
		MapServices: p.LB4Services, MapBackends: p.LB4Backends, MapRevNAT: p.LB4RevNAT, MapSocketNetNS: p.SockNetNS,
		MapAffinity: p.LB4Affinity, MapMembers: p.LB4Members, MapNAT: p.LB4NatFwd, MapNATReplies: p.LB4NatRev, MapMaglev: p.LB4Maglev,
		MapNATFragments: p.LB4Frags, MapServiceFlows: p.LB4Flows,
	}[name]
	if m == nil {
		return nil, fmt.Errorf("map %q: %w", name, ErrUnknownMap)
	}
	return m, nil
}

// countEntries counts in batches, or key by key where the kernel has no
// batch lookup for the map's type.
func countEntries[K, V any](m *ebpf.Map, limit int) (int, error) {
	count, err := countInBatches[K, V](m, limit)
	if errors.Is(err, errNoBatch) {
		return countKeys(m, limit)
	}
	return count, err
}

// errNoBatch means the first batch lookup was refused as unsupported.
var errNoBatch = errors.New("batch lookup not supported")

func countInBatches[K, V any](m *ebpf.Map, limit int) (int, error) {
	size := min(countBatch, int(m.MaxEntries()))
	keys, values := make([]K, size), make([]V, size)
	var (
		cursor ebpf.MapBatchCursor
		count  int
	)
	for first := true; ; first = false {
		n, err := m.BatchLookup(&cursor, keys, values, nil)
		count += n
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return count, nil // the end
		case err != nil && first && batchUnsupported(err):
			return 0, errNoBatch
		case err != nil:
			return 0, err
		case n == 0 || (limit > 0 && count >= limit):
			return count, nil
		}
	}
}

// enotsupp is the kernel's internal ENOTSUPP, which some map types
// return for an operation they lack; x/sys/unix does not name it.
const enotsupp = unix.Errno(524)

func batchUnsupported(err error) bool {
	return errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EINVAL) ||
		errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, enotsupp)
}

// countKeys walks the keys one syscall at a time. A hash map restarts
// from its first key when the previous one was deleted meanwhile, so the
// walk never goes past the map's capacity.
func countKeys(m *ebpf.Map, limit int) (int, error) {
	if limit <= 0 || limit > int(m.MaxEntries()) {
		limit = int(m.MaxEntries())
	}
	var (
		prev  any // nil: from the first key
		count int
	)
	key, next := make([]byte, m.KeySize()), make([]byte, m.KeySize())
	for count < limit {
		err := m.NextKey(prev, next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return 0, err
		}
		count++
		copy(key, next)
		prev = key
	}
	return count, nil
}

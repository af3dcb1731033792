package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"maps"
	"net/netip"
	"slices"
	"sort"

	"github.com/cilium/ebpf"

	"github.com/weirnet/weir/internal/policy"
)

// Bits of the fixed part of a policy key (bpf/lib/policy.h): ifindex,
// direction and padding, identity. Protocol and padding follow, then the
// port.
const (
	policyKeyFixedBits = 96
	policyKeyProtoBits = policyKeyFixedBits + 16
	cidrKeyPrefixBits  = 32
)

// ErrPolicyClosed marks an apply that could not write every entry: the
// endpoints it concerns were left closed (they deny everything, verdict
// stage "closed") until an apply of the whole state succeeds.
var ErrPolicyClosed = errors.New("policy update failed; affected endpoints fail closed")

// ErrConditionalRules is a WeirClusterNetworkPolicy rule with HTTP rules
// (policy.ClusterHTTP) on a node that reads no requests (L7 not enabled):
// the endpoints it selects are left closed rather than enforced without
// it.
var ErrConditionalRules = errors.New("cluster policy rules with HTTP rules need the node to read requests (L7), which it does not; enable L7 or remove their http field")

// policyKey builds the LPM key of one allow entry of an endpoint.
func policyKey(ifindex int, k policy.Key) lxcPolicyKey {
	key := lxcPolicyKey{Ifindex: uint32(ifindex), Dir: uint8(k.Direction), Identity: uint32(k.Peer)}
	switch {
	case k.Proto == policy.ProtoAny:
		key.Prefixlen = policyKeyFixedBits
	default:
		key.Proto = k.Proto
		key.Prefixlen = policyKeyProtoBits + uint32(k.Ports.Bits)
		// The port is stored in network byte order so its prefix is its
		// top bits; the struct field holds the raw bytes.
		var b [2]byte
		binary.BigEndian.PutUint16(b[:], k.Ports.Port)
		key.Dport = binary.NativeEndian.Uint16(b[:])
	}
	return key
}

// prefixOfCIDRKey is the inverse of cidrKey.
func prefixOfCIDRKey(k lxcCidrKey) (netip.Prefix, bool) {
	a, err := addrFromBPF(k.Addr)
	if err != nil || int(k.Prefixlen) < cidrKeyPrefixBits {
		return netip.Prefix{}, false
	}
	p, err := a.Prefix(int(k.Prefixlen) - cidrKeyPrefixBits)
	return p, err == nil
}

func cidrKey(p netip.Prefix) (lxcCidrKey, error) {
	a, err := bpfAddr(p.Masked().Addr())
	if err != nil {
		return lxcCidrKey{}, err
	}
	return lxcCidrKey{Prefixlen: uint32(cidrKeyPrefixBits + p.Bits()), Addr: a}, nil
}

// PolicyEndpoint locates a compiled endpoint in the datapath.
type PolicyEndpoint struct {
	Ifindex  int
	Identity policy.Identity
}

// ApplyPolicy writes a policy diff and then bumps the policy revision, so
// established flows are judged again on their next packet. endpoints
// resolves each diff's pod to its host veth; an endpoint it does not know
// is skipped (it has no veth to guard).
//
// The order keeps every state the datapath can see between two writes at
// most as open as the old policy or the new one:
//
//  1. Every address whose identity changes is closed: each new or changed
//     ipcache entry, each new CIDR prefix, each entry or prefix about to
//     go, is mapped to the unidentified identity, which is denied wherever
//     a policy applies. An entry the map already holds with its new
//     identity (the first load after a restart) does not move and stays. No address is then judged by keys meant for an
//     identity it is leaving or has not reached. Should one of these
//     writes fail, every enforcing endpoint is closed (denies everything)
//     before anything else is written: a missing except prefix would
//     otherwise meet allows written for the new state. Only a new pod
//     address the ipcache cannot take is left out: it is unidentified,
//     closed, already.
//  2. Per endpoint, new and changed keys longest first, so a narrower key
//     (an except, a Deny on one port) is in place before the broader
//     allow it carves from; then the flags; then stale keys shortest
//     first, so an address never falls back to a broader stale key. A key
//     that cannot be written closes its endpoint.
//  3. The new identities of the addresses closed in step 1. A write that
//     fails leaves its address closed.
//  4. The entries and prefixes that go; no key names their identities any
//     more.
//
// A failed apply returns an error wrapping ErrPolicyClosed; the endpoints
// and addresses it closed stay closed until an apply of the whole state
// succeeds.
func (n *Node) ApplyPolicy(d policy.Diff, endpoints map[string]PolicyEndpoint) error {
	var errs []error
	closeAll := false
	opening, contained := n.closeMovingAddresses(d)
	if opening != nil {
		closeAll = true
		errs = append(errs, opening, n.closeEnforcing(), ErrPolicyClosed)
	}
	if contained != nil {
		errs = append(errs, fmt.Errorf("%w: %w", contained, ErrPolicyClosed))
	}
	errs = append(errs, n.writeHTTPSets(d))
	for _, ed := range d.Endpoints {
		ep, ok := endpoints[ed.Pod]
		if !ok {
			continue
		}
		errs = append(errs, n.applyEndpointPolicy(ed, ep, closeAll))
	}
	if err := n.writeIdentities(d); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", err, ErrPolicyClosed))
	}
	errs = append(errs, n.deleteIdentities(d), n.bumpPolicyRevision(), n.deleteHTTPSets(d))
	return errors.Join(errs...)
}

// closeMovingAddresses maps every ipcache entry and CIDR prefix the diff
// adds, changes or removes to the unidentified identity. It returns the
// errors that leave policy open (closeAll) apart from those that leave
// only one address closed (contained): a pod address that cannot enter
// the ipcache stays unknown, which inside the pod CIDRs is unidentified
// already, so a full ipcache denies the new pod, not every endpoint.
func (n *Node) closeMovingAddresses(d policy.Diff) (closeAll, contained error) {
	var open, closed []error
	cidrs, err := n.cidrEntries(len(d.CIDRUpsert) > 0)
	if err != nil {
		open = append(open, err)
	}
	for a, id := range d.IPCacheUpsert {
		if cur, ok := n.ipcacheEntry(a); ok && cur == id {
			continue // already there (the first load after a restart): it does not move
		}
		err := n.putIPCache(a, policy.IdentityUnidentified)
		if err != nil && id >= policy.MinClusterIdentity && !n.inIPCache(a) {
			closed = append(closed, err)
			continue
		}
		open = append(open, err)
	}
	for _, a := range d.IPCacheDelete {
		open = append(open, n.putIPCache(a, policy.IdentityUnidentified))
	}
	for p, id := range d.CIDRUpsert {
		if cur, ok := cidrs[p]; ok && cur == id {
			continue
		}
		open = append(open, n.putCIDR(p, policy.IdentityUnidentified))
	}
	for _, p := range d.CIDRDelete {
		open = append(open, n.putCIDR(p, policy.IdentityUnidentified))
	}
	return errors.Join(open...), errors.Join(closed...)
}

// inIPCache reports whether the ipcache holds a.
func (n *Node) inIPCache(a netip.Addr) bool {
	_, ok := n.ipcacheEntry(a)
	return ok
}

// ipcacheEntry is a's identity in the ipcache, if it holds a.
func (n *Node) ipcacheEntry(a netip.Addr) (policy.Identity, bool) {
	k, err := bpfAddr(a)
	if err != nil {
		return 0, false
	}
	var id uint32
	if n.progs.IPCache.Lookup(k, &id) != nil {
		return 0, false
	}
	return policy.Identity(id), true
}

// cidrEntries reads the CIDR map's exact entries (a lookup in an LPM
// trie answers the longest match, not the entry of one prefix); none
// when want is false.
func (n *Node) cidrEntries(want bool) (map[netip.Prefix]policy.Identity, error) {
	out := map[netip.Prefix]policy.Identity{}
	if !want {
		return out, nil
	}
	var (
		k  lxcCidrKey
		id uint32
	)
	it := n.progs.CIDRIDs.Iterate()
	for it.Next(&k, &id) {
		if p, ok := prefixOfCIDRKey(k); ok {
			out[p] = policy.Identity(id)
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read the CIDR map: %w", err)
	}
	return out, nil
}

// writeIdentities writes the diff's new ipcache entries, then its new
// CIDR entries longest prefix first.
func (n *Node) writeIdentities(d policy.Diff) error {
	var errs []error
	for a, id := range d.IPCacheUpsert {
		errs = append(errs, n.putIPCache(a, id))
	}
	for _, p := range prefixesByLength(maps.Keys(d.CIDRUpsert), true) {
		errs = append(errs, n.putCIDR(p, d.CIDRUpsert[p]))
	}
	return errors.Join(errs...)
}

// deleteIdentities removes the diff's stale ipcache entries, then its
// stale CIDR entries shortest prefix first.
func (n *Node) deleteIdentities(d policy.Diff) error {
	var errs []error
	for _, a := range d.IPCacheDelete {
		if k, err := bpfAddr(a); err == nil {
			errs = append(errs, ignoreNotExist(n.writePolicyMap(func() error { return n.progs.IPCache.Delete(k) })))
		}
	}
	for _, p := range prefixesByLength(slices.Values(d.CIDRDelete), false) {
		if k, err := cidrKey(p); err == nil {
			errs = append(errs, ignoreNotExist(n.writePolicyMap(func() error { return n.progs.CIDRIDs.Delete(k) })))
		}
	}
	return errors.Join(errs...)
}

// prefixesByLength sorts prefixes longest (or shortest) first, ties by
// address.
func prefixesByLength(ps iter.Seq[netip.Prefix], longestFirst bool) []netip.Prefix {
	out := slices.Collect(ps)
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if a.Bits() != b.Bits() {
			if (a.Bits() > b.Bits()) == longestFirst {
				return -1
			}
			return 1
		}
		return a.Addr().Compare(b.Addr())
	})
	return out
}

// closeEnforcing closes every endpoint that some policy selects: it
// denies everything in both directions (POLICY_ENFORCE_CLOSED).
func (n *Node) closeEnforcing() error {
	var (
		idx   uint32
		flags lxcEpPolicy
	)
	enforcing := map[uint32]uint32{} // ifindex -> identity
	it := n.progs.EpPolicy.Iterate()
	for it.Next(&idx, &flags) {
		if flags.Enforce[0] != 0 || flags.Enforce[1] != 0 {
			enforcing[idx] = flags.Identity
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("list endpoints to close: %w", err)
	}
	var errs []error
	for idx, id := range enforcing {
		errs = append(errs, n.closeEndpoint(idx, id))
	}
	return errors.Join(errs...)
}

// closeEndpoint sets an endpoint to deny everything in both directions.
func (n *Node) closeEndpoint(idx, identity uint32) error {
	closed := lxcEpPolicy{Identity: identity, Enforce: [2]uint8{enforceClosed, enforceClosed}}
	if err := n.writePolicyMap(func() error { return n.progs.EpPolicy.Put(idx, closed) }); err != nil {
		return fmt.Errorf("close endpoint %d: %w", idx, err)
	}
	return nil
}

func (n *Node) putIPCache(a netip.Addr, id policy.Identity) error {
	k, err := bpfAddr(a)
	if err != nil {
		return err
	}
	if err := n.writePolicyMap(func() error { return n.progs.IPCache.Put(k, uint32(id)) }); err != nil {
		return fmt.Errorf("ipcache %v -> %d: %w", a, id, err)
	}
	return nil
}

func (n *Node) putCIDR(p netip.Prefix, id policy.Identity) error {
	k, err := cidrKey(p)
	if err != nil {
		return err
	}
	if err := n.writePolicyMap(func() error { return n.progs.CIDRIDs.Put(k, uint32(id)) }); err != nil {
		return fmt.Errorf("cidr identity %v -> %d: %w", p, id, err)
	}
	return nil
}

// writePolicyKeys writes the endpoint's new and changed keys longest
// first. The first that fails stops it.
func (n *Node) writePolicyKeys(ed policy.EndpointDiff, ep PolicyEndpoint) error {
	for _, k := range keysByLength(ep.Ifindex, ed.Upsert, true) {
		e := ed.Upsert[k.k]
		set := n.kernelHTTPSet(e.HTTP)
		if e.Tiers != 0 {
			if n.l7 == nil {
				// Cluster rules with HTTP rules are judged request by
				// request; a node that reads no requests would lose
				// their Deny. The endpoint stays closed.
				return fmt.Errorf("endpoint %s: %s: %w: %w", ed.Pod, k.k, ErrConditionalRules, ErrPolicyClosed)
			}
			set = n.tieredHTTPSet(e.L7)
		}
		if err := n.writePolicyMap(func() error {
			return n.progs.Policy.Put(k.key, policyEntry(e, set))
		}); err != nil {
			return fmt.Errorf("endpoint %s: write %s: %w: %w", ed.Pod, k.k, err, ErrPolicyClosed)
		}
	}
	return nil
}

// applyEndpointPolicy: new keys longest first, then flags, then stale
// keys shortest first. When a key cannot be written, or closed is set
// (the apply already failed), the endpoint is left closed.
func (n *Node) applyEndpointPolicy(ed policy.EndpointDiff, ep PolicyEndpoint, closed bool) error {
	idx := uint32(ep.Ifindex)
	if ed.Gone {
		err := ignoreNotExist(n.writePolicyMap(func() error { return n.progs.EpPolicy.Delete(idx) }))
		return errors.Join(err, n.deletePolicyKeys(ep.Ifindex, ed.Delete))
	}
	flags := lxcEpPolicy{Identity: uint32(ep.Identity), Enforce: enforceFlags(ed.Enforced, ed.Tiered)}
	failed := n.writePolicyKeys(ed, ep)
	if failed != nil || (closed && (flags.Enforce[0] != 0 || flags.Enforce[1] != 0)) {
		flags.Enforce = [2]uint8{enforceClosed, enforceClosed}
	}
	if err := n.writePolicyMap(func() error { return n.progs.EpPolicy.Put(idx, flags) }); err != nil {
		return errors.Join(failed, fmt.Errorf("endpoint %s flags: %w", ed.Pod, err))
	}
	return errors.Join(failed, n.deletePolicyKeys(ep.Ifindex, ed.Delete))
}

// orderedKey is a compiled key with its datapath form.
type orderedKey struct {
	k   policy.Key
	key lxcPolicyKey
}

// keysByLength returns the keys of entries as datapath keys of ifindex,
// longest prefix first (or last), ties in a fixed order.
func keysByLength[V any](ifindex int, entries map[policy.Key]V, longestFirst bool) []orderedKey {
	out := make([]orderedKey, 0, len(entries))
	for k := range entries {
		out = append(out, orderedKey{k, policyKey(ifindex, k)})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].key, out[j].key
		if a.Prefixlen != b.Prefixlen {
			return (a.Prefixlen > b.Prefixlen) == longestFirst
		}
		if a.Identity != b.Identity {
			return a.Identity < b.Identity
		}
		if a.Dir != b.Dir {
			return a.Dir < b.Dir
		}
		if a.Proto != b.Proto {
			return a.Proto < b.Proto
		}
		return a.Dport < b.Dport
	})
	return out
}

// Bits of ep_policy.enforce[dir] (POLICY_ENFORCE_* in bpf/lib/policy.h).
const (
	enforceNetworkPolicy uint8 = 1
	enforceTiers         uint8 = 2
	enforceClosed        uint8 = 4
)

func enforceFlags(np, tiers [2]bool) [2]uint8 {
	var out [2]uint8
	for d := range out {
		if np[d] {
			out[d] |= enforceNetworkPolicy
		}
		if tiers[d] {
			out[d] |= enforceTiers
		}
	}
	return out
}

// policyEntry is the datapath's form of a compiled entry, its HTTP set
// written as http, the kernel's number for it (bpf/lib/l7match.h). An
// allow restricted to HTTP rules with no kernel set (0: the node does not
// read requests yet) is written as no allow, closed, never opened whole.
// An entry with conditional cluster rules is written with its tier
// matches in the form the kernel decides by (policy.Entry.KernelTier)
// and its set marked tiered (L7SetTiered): its flows' requests are all
// judged in user space.
func policyEntry(e policy.Entry, http uint32) lxcPolicyEntry {
	out := lxcPolicyEntry{Allow: uint32(e.Allow)}
	switch {
	case e.Tiers != 0:
		// Every request of its flows goes to user space, which
		// judges them with every rule (NetworkPolicy's HTTP rules
		// included): no set of its needs to be in the kernel.
		out.Http = http
	case e.HTTP != 0:
		out.Http = http
		if http == 0 {
			out.Allow = 0
		}
	}
	for t := range e.Tier {
		m := e.KernelTier(policy.Tier(t))
		out.Tier[t].Rule, out.Tier[t].Rank, out.Tier[t].Action = uint32(m.Rule), m.Rank, uint8(m.Action)
		out.Log[t].Rule, out.Log[t].Rank, out.Log[t].Action = uint32(e.Log[t].Rule), e.Log[t].Rank, uint8(e.Log[t].Action)
	}
	return out
}

func (n *Node) deletePolicyKeys(ifindex int, keys []policy.Key) error {
	stale := make(map[policy.Key]struct{}, len(keys))
	for _, k := range keys {
		stale[k] = struct{}{}
	}
	var errs []error
	for _, k := range keysByLength(ifindex, stale, false) {
		errs = append(errs, ignoreNotExist(n.writePolicyMap(func() error { return n.progs.Policy.Delete(k.key) })))
	}
	return errors.Join(errs...)
}

// bumpPolicyRevision makes every tracked flow be judged again.
func (n *Node) bumpPolicyRevision() error {
	var rev uint32
	if err := n.progs.PolicyRev.Lookup(uint32(0), &rev); err != nil {
		return fmt.Errorf("read policy revision: %w", err)
	}
	if err := n.progs.PolicyRev.Put(uint32(0), rev+1); err != nil {
		return fmt.Errorf("bump policy revision: %w", err)
	}
	return nil
}

func ignoreNotExist(err error) error {
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	return err
}

// PrunePolicy deletes every policy, ipcache and CIDR entry that res (as
// placed by endpoints) does not hold, then bumps the policy revision. An
// agent runs it once after its first apply: the pinned maps may hold what
// an earlier run loaded, and the first diff, made against nothing, only
// adds. Flows judged again between that apply and the prune may have kept
// an allow deleted while the agent was down; the bump has every tracked
// flow judged once more, against exactly res.
func (n *Node) PrunePolicy(res *policy.Result, endpoints map[string]PolicyEndpoint) error {
	wantPolicy := map[lxcPolicyKey]bool{}
	wantEP := map[uint32]bool{}
	for pod, ep := range res.Endpoints {
		loc, ok := endpoints[pod]
		if !ok {
			continue
		}
		wantEP[uint32(loc.Ifindex)] = true
		for k := range ep.Entries {
			wantPolicy[policyKey(loc.Ifindex, k)] = true
		}
	}
	wantAddr := map[lxcWeirAddr]bool{}
	for a := range res.IPCache {
		if k, err := bpfAddr(a); err == nil {
			wantAddr[k] = true
		}
	}
	wantCIDR := map[lxcCidrKey]bool{}
	for p := range res.CIDRs {
		if k, err := cidrKey(p); err == nil {
			wantCIDR[k] = true
		}
	}
	return errors.Join(
		pruneMap(n, n.progs.Policy, wantPolicy),
		pruneMap(n, n.progs.EpPolicy, wantEP),
		pruneMap(n, n.progs.IPCache, wantAddr),
		pruneMap(n, n.progs.CIDRIDs, wantCIDR),
		n.bumpPolicyRevision(),
		n.pruneHTTPSets(res),
	)
}

// pruneMap deletes the keys of m that want lacks.
func pruneMap[K comparable](n *Node, m *ebpf.Map, want map[K]bool) error {
	var (
		k     K
		stale []K
	)
	val := make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&k, &val) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate %s: %w", m, err)
	}
	var errs []error
	for _, k := range stale {
		errs = append(errs, ignoreNotExist(n.writePolicyMap(func() error { return m.Delete(k) })))
	}
	return errors.Join(errs...)
}

// IsolateEndpoint closes a new endpoint in both directions until its first
// policy load replaces the entry: a pod is never reachable, nor able to
// send, before Weir knows which policies select it.
func (n *Node) IsolateEndpoint(ep *Endpoint) error {
	closed := lxcEpPolicy{Enforce: [2]uint8{enforceNetworkPolicy, enforceNetworkPolicy}}
	if err := n.writePolicyMap(func() error { return n.progs.EpPolicy.Put(uint32(ep.HostIfindex), closed) }); err != nil {
		return fmt.Errorf("isolate %s until policy is compiled: %w", ep.Spec.HostIfName(), err)
	}
	return nil
}

// PolicyEndpoints reads the endpoint policy map: for each host ifindex,
// whether ingress and egress are enforced.
func (n *Node) PolicyEndpoints() (map[int][2]bool, error) {
	var (
		idx   uint32
		flags lxcEpPolicy
	)
	out := map[int][2]bool{}
	it := n.progs.EpPolicy.Iterate()
	for it.Next(&idx, &flags) {
		out[int(idx)] = [2]bool{flags.Enforce[0] != 0, flags.Enforce[1] != 0}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate endpoint policy map: %w", err)
	}
	return out, nil
}

package datapath

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/weirnet/weir/internal/service"
)

// ErrServiceMapFull is returned when the service or backend map cannot take
// another entry; the frontends not written stay with kube-proxy.
var ErrServiceMapFull = errors.New("service map full")

// sockPrograms names the cgroup programs of bpf/sock.c by attach type.
func (p *Programs) sockPrograms() map[string]struct {
	prog *ebpf.Program
	at   ebpf.AttachType
} {
	return map[string]struct {
		prog *ebpf.Program
		at   ebpf.AttachType
	}{
		"connect4":     {p.SockConnect4, ebpf.AttachCGroupInet4Connect},
		"sendmsg4":     {p.SockSendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
		"recvmsg4":     {p.SockRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg},
		"getpeername4": {p.SockGetpeername4, ebpf.AttachCgroupInet4GetPeername},
		"connect6":     {p.SockConnect6, ebpf.AttachCGroupInet6Connect},
		"sendmsg6":     {p.SockSendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
		"recvmsg6":     {p.SockRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg},
		"getpeername6": {p.SockGetpeername6, ebpf.AttachCgroupInet6GetPeername},
		"sock_ops":     {p.SockTCPOps, ebpf.AttachCGroupSockOps},
		"sock_release": {p.SockRelease, ebpf.AttachCgroupInetSockRelease},
	}
}

// attachSockets attaches the socket programs to the cgroup v2 root, each
// link pinned under <pin>/cgroup.
func (n *Node) attachSockets() error {
	root, err := n.socketCgroupRoot()
	if err != nil {
		return err
	}
	dir := filepath.Join(n.cfg.PinDir, "cgroup")
	for name, p := range n.progs.sockPrograms() {
		if err := attachCgroupPinned(p.prog, root, p.at, filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}

// socketCgroupRoot is the cgroup v2 root the socket programs attach to:
// the configured one, or the machine's (mounted if need be).
func (n *Node) socketCgroupRoot() (string, error) {
	root := n.cfg.CgroupRoot
	if root == "" {
		var err error
		if root, _, err = EnsureCgroup2(); err != nil {
			return "", err
		}
	}
	if err := checkMachineCgroupRoot(root); err != nil {
		return "", err
	}
	return root, nil
}

// netnsCookie returns the kernel's cookie of the network namespace at path,
// the key bpf_get_netns_cookie() gives the socket programs.
func netnsCookie(path string) (uint64, error) {
	podNS, err := getNS(path)
	if err != nil {
		return 0, err
	}
	defer podNS.Close()
	var cookie uint64
	err = podNS.Do(func(ns.NetNS) error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("socket in %s: %w", path, err)
		}
		defer unix.Close(fd)
		cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		if err != nil {
			return fmt.Errorf("netns cookie of %s: %w", path, err)
		}
		return nil
	})
	return cookie, err
}

// nodeNetNSIfindex is the weir_sock_netns value of the node's own network
// namespace: no pod's host veth has index 0.
const nodeNetNSIfindex = 0

// setNodeSockets makes the socket programs translate Service addresses for
// the node's own processes and hostNetwork pods (on), or leave them to
// kube-proxy (off).
func (n *Node) setNodeSockets(on bool) error {
	path := n.cfg.NetNS
	if path == "" {
		path = "/proc/self/ns/net"
	}
	cookie, err := netnsCookie(path)
	if err != nil {
		return fmt.Errorf("node's own sockets: %w", err)
	}
	if on {
		if err := n.progs.SockNetNS.Put(cookie, uint32(nodeNetNSIfindex)); err != nil {
			return fmt.Errorf("translate the node's own sockets: %w", err)
		}
		return nil
	}
	if err := n.progs.SockNetNS.Delete(cookie); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("stop translating the node's own sockets: %w", err)
	}
	return nil
}

// forgetNetNS removes the socket-translation entries of the pods whose host
// veth ifindex matches; the node's own entry stays.
func (n *Node) forgetNetNS(match func(ifindex int) bool) error {
	var (
		cookie  uint64
		ifindex uint32
		stale   []uint64
	)
	it := n.progs.SockNetNS.Iterate()
	for it.Next(&cookie, &ifindex) {
		if ifindex != nodeNetNSIfindex && match(int(ifindex)) {
			stale = append(stale, cookie)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate netns map: %w", err)
	}
	var errs []error
	for _, c := range stale {
		if err := n.progs.SockNetNS.Delete(c); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete netns %d: %w", c, err))
		}
	}
	return errors.Join(errs...)
}

// Scopes of a service map entry (lb4_key.scope, bpf/lib/lb.h).
const (
	lbScopeSocket   = 0
	lbScopeExternal = 1
)

// lbFlagDrop is LB_FLAG_DROP (bpf/lib/lb.h).
const lbFlagDrop = 1

func lb4Key(f service.Frontend) sockLb4Key {
	k := sockLb4Key{Vip: be32(f.Addr), Port: htons(f.Port), Proto: f.Proto, Scope: lbScopeSocket}
	if f.External {
		k.Scope = lbScopeExternal
	}
	return k
}

func lb4Backend(b service.Backend) sockLb4Backend {
	return sockLb4Backend{Addr: be32(b.Addr), Port: htons(b.Port)}
}

// be32 is an IPv4 address as the __be32 a map stores, read back natively.
func be32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// htons is a port as the __be16 a map stores, read back natively.
func htons(p uint16) uint16 { return p>>8 | p<<8 }

// lbFrontend is what the service maps hold for one frontend: its service
// entry, backend slots, affinity members (backend to slot) and whether it
// has a Maglev table.
type lbFrontend struct {
	svc     sockLb4Service
	present bool // the service entry exists
	slots   map[uint32]sockLb4Backend
	members map[sockLb4Backend]uint32
	maglev  bool
}

// lbMaps is the content of the service maps, by frontend.
type lbMaps map[sockLb4Key]*lbFrontend

// at is key's content, made empty if there is none yet.
func (m lbMaps) at(key sockLb4Key) *lbFrontend {
	f := m[key]
	if f == nil {
		f = &lbFrontend{slots: map[uint32]sockLb4Backend{}, members: map[sockLb4Backend]uint32{}}
		m[key] = f
	}
	return f
}

// readLBMaps reads the service maps whole.
func (n *Node) readLBMaps() (lbMaps, error) {
	svcs, err := readMap[sockLb4Key, sockLb4Service](n.progs.LB4Services)
	if err != nil {
		return nil, fmt.Errorf("read service map: %w", err)
	}
	slots, err := readMap[sockLb4BackendKey, sockLb4Backend](n.progs.LB4Backends)
	if err != nil {
		return nil, fmt.Errorf("read backend map: %w", err)
	}
	members, err := readMap[sockLb4MemberKey, uint32](n.progs.LB4Members)
	if err != nil {
		return nil, fmt.Errorf("read affinity member map: %w", err)
	}
	m := lbMaps{}
	for k, v := range svcs {
		f := m.at(k)
		f.svc, f.present = v, true
	}
	for k, v := range slots {
		m.at(k.Svc).slots[k.Slot] = v
	}
	for k, slot := range members {
		m.at(k.Svc).members[k.Backend] = slot
	}
	var k sockLb4Key
	it := n.progs.LB4Maglev.Iterate()
	for v := new(hostLb4Maglev); it.Next(&k, v); {
		m.at(k).maglev = true
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read maglev map: %w", err)
	}
	return m, nil
}

// lbFrontendOf is what the service maps hold for key once e is written.
func lbFrontendOf(key sockLb4Key, e service.Entry) *lbFrontend {
	f := &lbFrontend{svc: lb4Service(e), present: true, slots: make(map[uint32]sockLb4Backend, len(e.Backends)),
		members: affinityMembers(e), maglev: key.Scope == lbScopeExternal && len(e.Backends) > 0}
	for i, b := range e.Backends {
		f.slots[uint32(i+1)] = lb4Backend(b)
	}
	return f
}

// SetServices makes the service maps translate exactly t's IPv4 frontends:
// UpdateServices for every frontend of t, and a deletion for every other
// frontend the maps hold.
func (n *Node) SetServices(t service.Table) error {
	have, err := n.lbMaps()
	if err != nil {
		return err
	}
	want := make(map[sockLb4Key]*service.Entry, len(t))
	for f, e := range t {
		if f.Addr.Is4() {
			want[lb4Key(f)] = &e
		}
	}
	for key := range have {
		if _, ok := want[key]; !ok {
			want[key] = nil
		}
	}
	return n.writeFrontends(have, want)
}

// UpdateServices writes the IPv4 frontends of changes: each to its entry,
// or away where the entry is nil; the maps' other frontends stay as they
// are. Only what differs from the maps is written: the maps are read
// once, and after a write that succeeded whole the node remembers what
// they hold, so a change to one Service costs a few syscalls at any
// Service count. Each frontend is rewritten so a concurrent connect always
// finds a consistent service: new slots before a larger count, a smaller
// count before slots are removed, the service before its slots on
// deletion. The members of affinity Services change around that: a
// backend that goes stops being remembered before its slot goes, and one
// that comes is a member before a client can pick it.
func (n *Node) UpdateServices(changes map[service.Frontend]*service.Entry) error {
	have, err := n.lbMaps()
	if err != nil {
		return err
	}
	want := make(map[sockLb4Key]*service.Entry, len(changes))
	for f, e := range changes {
		if f.Addr.Is4() {
			want[lb4Key(f)] = e
		}
	}
	return n.writeFrontends(have, want)
}

// lbMaps is what the service maps hold: as remembered after the last
// write that succeeded whole, else as read.
func (n *Node) lbMaps() (lbMaps, error) {
	if n.lbWritten != nil {
		return n.lbWritten, nil
	}
	return n.readLBMaps()
}

// writeFrontends writes want's frontends (nil: away) over have, which it
// updates to match. The node remembers have only when every write
// succeeded; otherwise the next write reads the maps again.
func (n *Node) writeFrontends(have lbMaps, want map[sockLb4Key]*service.Entry) error {
	n.lbWritten = nil
	var errs []error
	for key, e := range want {
		if err := n.writeFrontend(key, e, have[key]); err != nil {
			errs = append(errs, &FrontendError{Frontend: frontendOf(key), Err: err})
			continue
		}
		if e == nil {
			delete(have, key)
		} else {
			have[key] = lbFrontendOf(key, *e)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	n.lbWritten = have
	return nil
}

// writeFrontend writes one frontend's entry e (nil: deletes it) where the
// maps hold cur (nil: nothing).
func (n *Node) writeFrontend(key sockLb4Key, e *service.Entry, cur *lbFrontend) error {
	if cur == nil {
		cur = lbMaps{}.at(key)
	}
	var wantMembers map[sockLb4Backend]uint32
	if e != nil {
		wantMembers = affinityMembers(*e)
	}
	var errs []error
	for b := range cur.members {
		if _, ok := wantMembers[b]; ok {
			continue
		}
		if err := n.progs.LB4Members.Delete(sockLb4MemberKey{Svc: key, Backend: b}); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete affinity member: %w", err))
		}
	}
	for b, slot := range wantMembers {
		if have, ok := cur.members[b]; ok && have == slot {
			continue
		}
		if err := n.progs.LB4Members.Put(sockLb4MemberKey{Svc: key, Backend: b}, slot); err != nil {
			errs = append(errs, fmt.Errorf("affinity member: %w", mapWriteErr(err)))
		}
	}
	count := 0
	if e == nil {
		if cur.present {
			if err := n.progs.LB4Services.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("delete service: %w", err))
			}
		}
	} else if err := n.setService(key, *e, cur); err != nil {
		return errors.Join(append(errs, err)...) // its stale slots may still be counted
	} else {
		count = len(e.Backends)
	}
	if cur.maglev && count == 0 {
		if err := n.progs.LB4Maglev.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete maglev table: %w", err))
		}
	}
	// Slots past the count, and any a crash left behind.
	for slot := range cur.slots {
		if slot >= 1 && int(slot) <= count {
			continue
		}
		if err := n.progs.LB4Backends.Delete(sockLb4BackendKey{Svc: key, Slot: slot}); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete backend slot: %w", err))
		}
	}
	return errors.Join(errs...)
}

// affinityMembers are the member entries of an affinity service e, each
// backend with its slot; none without affinity.
func affinityMembers(e service.Entry) map[sockLb4Backend]uint32 {
	out := map[sockLb4Backend]uint32{}
	if e.AffinityTimeout <= 0 {
		return out
	}
	for i, b := range e.Backends {
		out[lb4Backend(b)] = uint32(i + 1)
	}
	return out
}

// lb4Service is the service map's value for e.
func lb4Service(e service.Entry) sockLb4Service {
	secs := uint32(min(e.AffinityTimeout/time.Second, math.MaxUint32))
	if e.AffinityTimeout > 0 && secs == 0 {
		secs = 1 // shorter than the map can say: keep affinity, briefly
	}
	v := sockLb4Service{Count: uint16(len(e.Backends)), AffinityS: secs}
	if e.DropWhenEmpty {
		v.Flags |= lbFlagDrop
	}
	return v
}

// FrontendError is SetServices' error for one frontend it could not
// write: the frontend keeps what it had (or stays untranslated), never
// part of its new backends. SetServices joins one per such frontend, so a
// caller can say which Services a full map left out.
type FrontendError struct {
	Frontend service.Frontend
	Err      error
}

func (e *FrontendError) Error() string {
	return fmt.Sprintf("service %v:%d/%d: %v", e.Frontend.Addr, e.Frontend.Port, e.Frontend.Proto, e.Err)
}

func (e *FrontendError) Unwrap() error { return e.Err }

// FrontendErrors are the frontends err (from SetServices) names.
func FrontendErrors(err error) []*FrontendError {
	var out []*FrontendError
	var walk func(error)
	walk = func(err error) {
		var fe *FrontendError
		switch e := err.(type) {
		case nil:
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				walk(inner)
			}
		default:
			if errors.As(err, &fe) {
				out = append(out, fe)
			}
		}
	}
	walk(err)
	return out
}

// ErrTooManyBackends is returned for a frontend with more backends than a
// service entry counts (65,535); it is not written.
var ErrTooManyBackends = errors.New("more backends than a service entry holds")

func (n *Node) setService(key sockLb4Key, e service.Entry, cur *lbFrontend) error {
	if len(e.Backends) > math.MaxUint16 {
		return fmt.Errorf("%d backends: %w", len(e.Backends), ErrTooManyBackends)
	}
	val := lb4Service(e)
	have := cur.svc
	if cur.present && val.Count < have.Count {
		if err := n.progs.LB4Services.Put(key, val); err != nil {
			return mapWriteErr(err)
		}
		have = val
	}
	changed := !cur.present || val.Count != have.Count
	for i, b := range e.Backends {
		slot, bv := uint32(i+1), lb4Backend(b)
		if v, ok := cur.slots[slot]; ok && v == bv {
			continue
		}
		changed = true
		if err := n.progs.LB4Backends.Put(sockLb4BackendKey{Svc: key, Slot: slot}, bv); err != nil {
			return mapWriteErr(err)
		}
	}
	if key.Scope == lbScopeExternal && (changed || !cur.maglev) {
		if err := n.setMaglev(key, e.Backends); err != nil {
			return err
		}
	}
	if !cur.present || have != val {
		if err := n.progs.LB4Services.Put(key, val); err != nil {
			return mapWriteErr(err)
		}
	}
	return nil
}

// setMaglev writes the Maglev table packets from outside pick key's
// backends with (bpf/lib/nodeport.h); none without backends.
func (n *Node) setMaglev(key sockLb4Key, backends []service.Backend) error {
	table := service.Maglev(backends)
	if len(table) == 0 {
		if err := n.progs.LB4Maglev.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete maglev table: %w", err)
		}
		return nil
	}
	var v hostLb4Maglev
	for i, b := range table {
		v.Slot[i] = b + 1 // entries are slots, counted from 1
	}
	if err := n.progs.LB4Maglev.Put(key, &v); err != nil {
		return fmt.Errorf("maglev table: %w", mapWriteErr(err))
	}
	return nil
}

// readMap reads every entry of m.
func readMap[K comparable, V any](m *ebpf.Map) (map[K]V, error) {
	out := map[K]V{}
	var (
		k K
		v V
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	return out, it.Err()
}

func frontendOf(k sockLb4Key) service.Frontend {
	return service.Frontend{Addr: addrOfBE32(k.Vip), Port: htons(k.Port), Proto: k.Proto, External: k.Scope == lbScopeExternal}
}

// addrOfBE32 is the inverse of be32.
func addrOfBE32(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)})
}

func mapWriteErr(err error) error {
	if errors.Is(err, unix.E2BIG) || errors.Is(err, unix.ENOMEM) {
		return fmt.Errorf("%w: %w", ErrServiceMapFull, err)
	}
	return err
}

// Services reads the service maps back as a table: what sockets are
// translated with right now. A frontend whose slots are incomplete is
// returned with the slots that exist.
func (n *Node) Services() (service.Table, error) {
	svcs, err := readMap[sockLb4Key, sockLb4Service](n.progs.LB4Services)
	if err != nil {
		return nil, fmt.Errorf("read service map: %w", err)
	}
	t := service.Table{}
	for key, v := range svcs {
		e := service.Entry{AffinityTimeout: time.Duration(v.AffinityS) * time.Second, DropWhenEmpty: v.Flags&lbFlagDrop != 0}
		for slot := uint32(1); slot <= uint32(v.Count); slot++ {
			var b sockLb4Backend
			if err := n.progs.LB4Backends.Lookup(sockLb4BackendKey{Svc: key, Slot: slot}, &b); err != nil {
				continue
			}
			e.Backends = append(e.Backends, service.Backend{Addr: addrOfBE32(b.Addr), Port: htons(b.Port)})
		}
		t[frontendOf(key)] = e
	}
	return t, nil
}

// TranslatedNetNS lists the network namespaces (by cookie) whose sockets
// are translated, with the host veth ifindex of each.
func (n *Node) TranslatedNetNS() (map[uint64]int, error) {
	out := map[uint64]int{}
	var (
		cookie  uint64
		ifindex uint32
	)
	it := n.progs.SockNetNS.Iterate()
	for it.Next(&cookie, &ifindex) {
		out[cookie] = int(ifindex)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate netns map: %w", err)
	}
	return out, nil
}

// SetNodeAddrs makes weir_lb4_node_addrs hold exactly addrs' IPv4
// addresses: where a NodePort's any-node socket entry serves (lb.h). New
// addresses are written before stale ones go, so a NodePort stays served
// at every address that remains one.
func (n *Node) SetNodeAddrs(addrs []netip.Addr) error {
	want := map[uint32]bool{}
	for _, a := range addrs {
		if a.Is4() {
			want[be32(a)] = true
		}
	}
	have := map[uint32]bool{}
	var k uint32
	var v uint32
	it := n.progs.LB4NodeAddrs.Iterate()
	for it.Next(&k, &v) {
		have[k] = true
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read node address map: %w", err)
	}
	for a := range want {
		if !have[a] {
			if err := n.progs.LB4NodeAddrs.Put(a, uint32(0)); err != nil {
				return fmt.Errorf("node address %v: %w", addrOfBE32(a), mapWriteErr(err))
			}
		}
	}
	for a := range have {
		if !want[a] {
			if err := n.progs.LB4NodeAddrs.Delete(a); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("delete node address %v: %w", addrOfBE32(a), err)
			}
		}
	}
	return nil
}

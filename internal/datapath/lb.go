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
	}
}

// attachSockets attaches the socket programs to the cgroup v2 root, each
// link pinned under <pin>/cgroup.
func (n *Node) attachSockets() error {
	root := n.cfg.CgroupRoot
	if root == "" {
		var err error
		if root, _, err = EnsureCgroup2(); err != nil {
			return err
		}
	}
	dir := filepath.Join(n.cfg.PinDir, "cgroup")
	for name, p := range n.progs.sockPrograms() {
		if err := attachCgroupPinned(p.prog, root, p.at, filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
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

// lbMaps is the content of the service, backend and affinity member maps,
// and which frontends have a Maglev table.
type lbMaps struct {
	services map[sockLb4Key]sockLb4Service
	slots    map[sockLb4BackendKey]sockLb4Backend
	members  map[sockLb4MemberKey]uint32
	maglev   map[sockLb4Key]bool
}

// readLBMaps reads the service maps whole.
func (n *Node) readLBMaps() (*lbMaps, error) {
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
	maglev := map[sockLb4Key]bool{}
	var k sockLb4Key
	it := n.progs.LB4Maglev.Iterate()
	for v := new(hostLb4Maglev); it.Next(&k, v); {
		maglev[k] = true
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read maglev map: %w", err)
	}
	return &lbMaps{services: svcs, slots: slots, members: members, maglev: maglev}, nil
}

// lbMapsOf is what the service maps hold once want is written.
func lbMapsOf(want map[sockLb4Key]service.Entry) *lbMaps {
	m := &lbMaps{services: map[sockLb4Key]sockLb4Service{}, slots: map[sockLb4BackendKey]sockLb4Backend{}, members: affinityMembers(want), maglev: map[sockLb4Key]bool{}}
	for key, e := range want {
		m.services[key] = lb4Service(e)
		if key.Scope == lbScopeExternal && len(e.Backends) > 0 {
			m.maglev[key] = true
		}
		for i, b := range e.Backends {
			m.slots[sockLb4BackendKey{Svc: key, Slot: uint32(i + 1)}] = lb4Backend(b)
		}
	}
	return m
}

// SetServices makes the service maps translate exactly t's IPv4 frontends.
// Only what differs from the maps is written: the maps are read once, and
// after a write that succeeded whole the node remembers what they hold,
// so a change to one Service costs a few syscalls at any Service count.
// Each frontend is rewritten so a concurrent connect always finds a
// consistent service: new slots before a larger count, a smaller count
// before slots are removed, the service before its slots on deletion. The
// members of affinity Services change around that: a backend that goes
// stops being remembered before its slot goes, and one that comes is a
// member before a client can pick it.
func (n *Node) SetServices(t service.Table) (retErr error) {
	have := n.lbWritten
	n.lbWritten = nil // until this write has succeeded whole
	if have == nil {
		var err error
		if have, err = n.readLBMaps(); err != nil {
			return err
		}
	}
	want := map[sockLb4Key]service.Entry{}
	for f, e := range t {
		if f.Addr.Is4() {
			want[lb4Key(f)] = e
		}
	}
	wantMembers := affinityMembers(want)
	defer func() {
		if retErr == nil {
			n.lbWritten = lbMapsOf(want)
		}
	}()

	var errs []error
	for mk := range have.members {
		if _, ok := wantMembers[mk]; ok {
			continue
		}
		if err := n.progs.LB4Members.Delete(mk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete affinity member: %w", err))
		}
	}
	for mk, slot := range wantMembers {
		if cur, ok := have.members[mk]; ok && cur == slot {
			continue
		}
		if err := n.progs.LB4Members.Put(mk, slot); err != nil {
			errs = append(errs, fmt.Errorf("service %v: affinity member: %w", frontendOf(mk.Svc), mapWriteErr(err)))
		}
	}
	for key, e := range want {
		cur, present := have.services[key]
		if err := n.setService(key, e, cur, present, have); err != nil {
			errs = append(errs, &FrontendError{Frontend: frontendOf(key), Err: err})
		}
	}
	for key := range have.services {
		if _, ok := want[key]; ok {
			continue
		}
		if err := n.progs.LB4Services.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete service: %w", err))
		}
	}
	for key := range have.maglev {
		if e, ok := want[key]; ok && len(e.Backends) > 0 {
			continue
		}
		if err := n.progs.LB4Maglev.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete maglev table: %w", err))
		}
	}
	// Slots of deleted services, and any a crash left behind.
	for bk := range have.slots {
		if e, ok := want[bk.Svc]; ok && bk.Slot >= 1 && int(bk.Slot) <= len(e.Backends) {
			continue
		}
		if err := n.progs.LB4Backends.Delete(bk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete backend slot: %w", err))
		}
	}
	return errors.Join(errs...)
}

// affinityMembers are the member entries of want's affinity services, each
// with its backend's slot.
func affinityMembers(want map[sockLb4Key]service.Entry) map[sockLb4MemberKey]uint32 {
	out := map[sockLb4MemberKey]uint32{}
	for key, e := range want {
		if e.AffinityTimeout <= 0 {
			continue
		}
		for i, b := range e.Backends {
			out[sockLb4MemberKey{Svc: key, Backend: lb4Backend(b)}] = uint32(i + 1)
		}
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

func (n *Node) setService(key sockLb4Key, e service.Entry, cur sockLb4Service, present bool, have *lbMaps) error {
	if len(e.Backends) > math.MaxUint16 {
		return fmt.Errorf("%d backends: %w", len(e.Backends), ErrTooManyBackends)
	}
	val := lb4Service(e)
	if present && val.Count < cur.Count {
		if err := n.progs.LB4Services.Put(key, val); err != nil {
			return mapWriteErr(err)
		}
		cur = val
	}
	changed := !present || val.Count != cur.Count
	for i, b := range e.Backends {
		bk := sockLb4BackendKey{Svc: key, Slot: uint32(i + 1)}
		bv := lb4Backend(b)
		if slot, ok := have.slots[bk]; ok && slot == bv {
			continue
		}
		changed = true
		if err := n.progs.LB4Backends.Put(bk, bv); err != nil {
			return mapWriteErr(err)
		}
	}
	if key.Scope == lbScopeExternal && (changed || !have.maglev[key]) {
		if err := n.setMaglev(key, e.Backends); err != nil {
			return err
		}
	}
	if !present || cur != val {
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

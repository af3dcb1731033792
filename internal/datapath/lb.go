package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"

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

// forgetNetNS removes the socket-translation entries of the pods whose host
// veth ifindex matches.
func (n *Node) forgetNetNS(match func(ifindex int) bool) error {
	var (
		cookie  uint64
		ifindex uint32
		stale   []uint64
	)
	it := n.progs.SockNetNS.Iterate()
	for it.Next(&cookie, &ifindex) {
		if match(int(ifindex)) {
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

func lb4Key(f service.Frontend) sockLb4Key {
	return sockLb4Key{Vip: be32(f.Addr), Port: htons(f.Port), Proto: f.Proto}
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

// SetServices makes the service maps translate exactly t's IPv4 frontends.
// Each frontend is rewritten so a concurrent connect always finds a
// consistent service: new slots before a larger count, a smaller count
// before slots are removed, the service before its slots on deletion.
func (n *Node) SetServices(t service.Table) error {
	svcs, bes := n.progs.LB4Services, n.progs.LB4Backends
	have := map[sockLb4Key]uint32{}
	var (
		k sockLb4Key
		v sockLb4Service
	)
	it := svcs.Iterate()
	for it.Next(&k, &v) {
		have[k] = v.Count
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate service map: %w", err)
	}
	haveSlots := map[sockLb4BackendKey]sockLb4Backend{}
	var (
		bk sockLb4BackendKey
		bv sockLb4Backend
	)
	bit := bes.Iterate()
	for bit.Next(&bk, &bv) {
		haveSlots[bk] = bv
	}
	if err := bit.Err(); err != nil {
		return fmt.Errorf("iterate backend map: %w", err)
	}

	var errs []error
	want := map[sockLb4Key]bool{}
	for f, backends := range t {
		if !f.Addr.Is4() || len(backends) == 0 {
			continue
		}
		key := lb4Key(f)
		want[key] = true
		if err := n.setService(key, backends, have[key], haveSlots); err != nil {
			errs = append(errs, fmt.Errorf("service %v:%d/%d: %w", f.Addr, f.Port, f.Proto, err))
		}
	}
	for key := range have {
		if want[key] {
			continue
		}
		if err := svcs.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete service: %w", err))
		}
	}
	// Slots of deleted services, and any a crash left behind.
	for bk := range haveSlots {
		if want[bk.Svc] && bk.Slot >= 1 && int(bk.Slot) <= len(t[frontendOf(bk.Svc)]) {
			continue
		}
		if err := bes.Delete(bk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete backend slot: %w", err))
		}
	}
	return errors.Join(errs...)
}

func (n *Node) setService(key sockLb4Key, backends []service.Backend, haveCount uint32, haveSlots map[sockLb4BackendKey]sockLb4Backend) error {
	count := uint32(len(backends))
	if count < haveCount {
		if err := n.progs.LB4Services.Put(key, sockLb4Service{Count: count}); err != nil {
			return mapWriteErr(err)
		}
	}
	for i, b := range backends {
		bk := sockLb4BackendKey{Svc: key, Slot: uint32(i + 1)}
		val := lb4Backend(b)
		if cur, ok := haveSlots[bk]; ok && cur == val {
			continue
		}
		if err := n.progs.LB4Backends.Put(bk, val); err != nil {
			return mapWriteErr(err)
		}
	}
	if count > haveCount {
		if err := n.progs.LB4Services.Put(key, sockLb4Service{Count: count}); err != nil {
			return mapWriteErr(err)
		}
	}
	return nil
}

func frontendOf(k sockLb4Key) service.Frontend {
	return service.Frontend{Addr: addrOfBE32(k.Vip), Port: htons(k.Port), Proto: k.Proto}
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
	counts := map[sockLb4Key]uint32{}
	var (
		k sockLb4Key
		v sockLb4Service
	)
	it := n.progs.LB4Services.Iterate()
	for it.Next(&k, &v) {
		counts[k] = v.Count
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate service map: %w", err)
	}
	t := service.Table{}
	for key, count := range counts {
		var bes []service.Backend
		for slot := uint32(1); slot <= count; slot++ {
			var b sockLb4Backend
			if err := n.progs.LB4Backends.Lookup(sockLb4BackendKey{Svc: key, Slot: slot}, &b); err != nil {
				continue
			}
			bes = append(bes, service.Backend{Addr: addrOfBE32(b.Addr), Port: htons(b.Port)})
		}
		t[frontendOf(key)] = bes
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

package ipam

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/weirnet/weir/internal/fsutil"
)

var (
	// ErrPoolExhausted is returned when every address of the CIDR is leased.
	ErrPoolExhausted = errors.New("address pool exhausted")
	// ErrLeaseExists is returned when an attachment already holds an address.
	ErrLeaseExists = errors.New("attachment already has an address")
	// ErrCorruptState is returned when the lease file cannot be trusted.
	ErrCorruptState = errors.New("corrupt IPAM state")
)

// Owner identifies an attachment: one interface of one container.
type Owner struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

func (o Owner) String() string { return o.ContainerID + "/" + o.IfName }

// Lease is an address held by an attachment, with what the agent needs to
// find and tear the attachment down again after a restart.
type Lease struct {
	Owner
	Addr         netip.Addr        `json:"addr"`
	NetNS        string            `json:"netns,omitempty"`
	PodNamespace string            `json:"podNamespace,omitempty"`
	PodName      string            `json:"podName,omitempty"`
	Created      time.Time         `json:"created"`
	Labels       map[string]string `json:"labels,omitempty"`
	// HostPorts are the attachment's hostPort mappings, kept so a
	// restarted agent serves them again.
	HostPorts []HostPort `json:"hostPorts,omitempty"`
}

// HostPort maps Port on the node's address (or HostIP, when valid) to the
// pod's ContainerPort over Proto (an IP protocol number).
type HostPort struct {
	HostIP        netip.Addr `json:"hostIP,omitzero"`
	Port          uint16     `json:"port"`
	ContainerPort uint16     `json:"containerPort"`
	Proto         uint8      `json:"proto"`
}

// state is the on-disk format.
type state struct {
	CIDR   netip.Prefix `json:"cidr"`
	Last   netip.Addr   `json:"last,omitempty"` // next-fit cursor
	Leases []Lease      `json:"leases"`
}

// Allocator leases the addresses of one CIDR. It is safe for concurrent use.
type Allocator struct {
	mu      sync.Mutex
	path    string
	cidr    netip.Prefix
	gateway netip.Addr
	last    netip.Addr
	leases  map[Owner]Lease
	byAddr  map[netip.Addr]Owner
}

// Open loads the lease file at path, creating an empty pool for cidr when
// the file does not exist. Leases outside cidr (the node's CIDR changed)
// are kept so their attachments can still be torn down, but never handed out.
func Open(path string, cidr netip.Prefix) (*Allocator, error) {
	if !cidr.IsValid() || cidr.Bits() >= cidr.Addr().BitLen()-1 {
		return nil, fmt.Errorf("pod CIDR %v is too small for pods", cidr)
	}
	cidr = cidr.Masked()
	a := &Allocator{
		path:    path,
		cidr:    cidr,
		gateway: cidr.Addr().Next(),
		leases:  map[Owner]Lease{},
		byAddr:  map[netip.Addr]Owner{},
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return a, a.saveLocked()
	}
	if err != nil {
		return nil, fmt.Errorf("read IPAM state %s: %w", path, err)
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", path, ErrCorruptState, err)
	}
	for _, l := range st.Leases {
		if _, dup := a.byAddr[l.Addr]; dup {
			return nil, fmt.Errorf("%s: address %v leased twice: %w", path, l.Addr, ErrCorruptState)
		}
		a.leases[l.Owner] = l
		a.byAddr[l.Addr] = l.Owner
	}
	if cidr.Contains(st.Last) {
		a.last = st.Last
	}
	return a, nil
}

// CIDR is the pool's prefix.
func (a *Allocator) CIDR() netip.Prefix { return a.cidr }

// Gateway is the address pods route through; it is never leased.
func (a *Allocator) Gateway() netip.Addr { return a.gateway }

// Allocate leases a free address to l.Owner, filling in l.Addr. Addresses
// are handed out next-fit, so a just-released address is the last to be
// reused and a late packet for a deleted pod does not reach its successor.
func (a *Allocator) Allocate(l Lease) (Lease, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if old, ok := a.leases[l.Owner]; ok {
		return old, fmt.Errorf("%s holds %v: %w", l.Owner, old.Addr, ErrLeaseExists)
	}
	addr, ok := a.nextFree()
	if !ok {
		return Lease{}, fmt.Errorf("%v has no free address (%d leased): %w", a.cidr, len(a.leases), ErrPoolExhausted)
	}
	l.Addr = addr
	if l.Created.IsZero() {
		l.Created = time.Now().UTC()
	}
	a.leases[l.Owner] = l
	a.byAddr[addr] = l.Owner
	prevLast := a.last
	a.last = addr
	if err := a.saveLocked(); err != nil {
		delete(a.leases, l.Owner)
		delete(a.byAddr, addr)
		a.last = prevLast
		return Lease{}, err
	}
	return l, nil
}

func (a *Allocator) nextFree() (netip.Addr, bool) {
	first := a.gateway.Next()
	start := first
	if a.last.IsValid() && a.usable(a.last.Next()) {
		start = a.last.Next()
	}
	for addr := start; a.usable(addr); addr = addr.Next() {
		if _, used := a.byAddr[addr]; !used {
			return addr, true
		}
	}
	for addr := first; addr != start && a.usable(addr); addr = addr.Next() {
		if _, used := a.byAddr[addr]; !used {
			return addr, true
		}
	}
	return netip.Addr{}, false
}

// usable excludes the network, gateway and (IPv4) broadcast addresses.
func (a *Allocator) usable(addr netip.Addr) bool {
	if !a.cidr.Contains(addr) || addr == a.cidr.Addr() || addr == a.gateway {
		return false
	}
	return !(addr.Is4() && !a.cidr.Contains(addr.Next()))
}

// Release frees the owner's address; it reports false when there was none.
func (a *Allocator) Release(o Owner) (Lease, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	l, ok := a.leases[o]
	if !ok {
		return Lease{}, false, nil
	}
	delete(a.leases, o)
	delete(a.byAddr, l.Addr)
	if err := a.saveLocked(); err != nil {
		a.leases[o] = l
		a.byAddr[l.Addr] = o
		return Lease{}, false, err
	}
	return l, true, nil
}

// Get returns the owner's lease.
func (a *Allocator) Get(o Owner) (Lease, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	l, ok := a.leases[o]
	return l, ok
}

// List returns every lease ordered by address.
func (a *Allocator) List() []Lease {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Lease, 0, len(a.leases))
	for _, l := range a.leases {
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr.Less(out[j].Addr) })
	return out
}

// Capacity is the number of leasable addresses.
func (a *Allocator) Capacity() int {
	hostBits := a.cidr.Addr().BitLen() - a.cidr.Bits()
	if hostBits > 30 {
		return 1 << 30
	}
	n := 1<<hostBits - 2 // network and gateway
	if a.cidr.Addr().Is4() {
		n-- // broadcast
	}
	return n
}

// saveLocked replaces the state file atomically: write a temporary file,
// fsync it, rename it over the old one and fsync the directory, so a crash
// leaves either the old or the new state, never a torn one.
func (a *Allocator) saveLocked() error {
	st := state{CIDR: a.cidr, Last: a.last, Leases: make([]Lease, 0, len(a.leases))}
	for _, l := range a.leases {
		st.Leases = append(st.Leases, l)
	}
	sort.Slice(st.Leases, func(i, j int) bool { return st.Leases[i].Addr.Less(st.Leases[j].Addr) })
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode IPAM state: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(a.path), 0o700); err != nil {
		return fmt.Errorf("create IPAM state dir: %w", err)
	}
	if err := fsutil.WriteFileAtomic(a.path, b, 0o600); err != nil {
		return fmt.Errorf("save IPAM state: %w", err)
	}
	return nil
}

package agent

import (
	"net/netip"
	"sync"

	"github.com/weirnet/weir/internal/service"
)

// serviceNames names the Service (or hostPort) of each frontend the
// service maps hold, for flow records. Records are named by the event
// reader and the batch recorder, which must not wait on the agent's lock
// while a large Service sync holds it, so the names are kept apart,
// changed with each write.
type serviceNames struct {
	mu     sync.RWMutex
	owners map[service.Frontend]string
	// nodeAddrs are the addresses where NodePorts' any-node entries serve.
	nodeAddrs map[netip.Addr]bool
}

// setNodeAddrs records where the any-node entries serve.
func (s *serviceNames) setNodeAddrs(addrs []netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodeAddrs = make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		s.nodeAddrs[a] = true
	}
}

// written records a write of the service maps: old and now are the
// written frontends before and after (whole: now is every frontend);
// owner names a frontend.
func (s *serviceNames) written(old, now service.Table, whole bool, owner func(service.Frontend) string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if whole || s.owners == nil {
		s.owners = make(map[service.Frontend]string, len(now))
	}
	for f := range old {
		delete(s.owners, f)
	}
	for f := range now {
		s.owners[f] = owner(f)
	}
}

// name is the owner of the frontend a client named: addr, for a socket
// or a flow from outside, or, for a NodePort a socket reached at a node's
// address, its any-node entry. "" when the maps hold no such frontend
// (any more).
func (s *serviceNames) name(addr netip.AddrPort, proto uint8) string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, external := range []bool{false, true} {
		if o, ok := s.owners[service.Frontend{Addr: addr.Addr(), Port: addr.Port(), Proto: proto, External: external}]; ok {
			return o
		}
	}
	if !s.nodeAddrs[addr.Addr()] && !addr.Addr().IsLoopback() {
		return "" // a ClusterIP gone since, not a NodePort
	}
	return s.owners[service.Frontend{Addr: service.AnyNode, Port: addr.Port(), Proto: proto}]
}

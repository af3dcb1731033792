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

// name is the owner of the frontend a socket named: addr, or, for a
// NodePort reached at a node's address, its any-node entry. "" when the
// maps hold no such frontend (any more).
func (s *serviceNames) name(addr netip.AddrPort, proto uint8) string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if o, ok := s.owners[service.Frontend{Addr: addr.Addr(), Port: addr.Port(), Proto: proto}]; ok {
		return o
	}
	return s.owners[service.Frontend{Addr: service.AnyNode, Port: addr.Port(), Proto: proto}]
}

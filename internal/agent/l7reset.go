package agent

import (
	"context"
	"net/netip"
	"time"
)

// resetClosedHTTPEvery is how often the agent looks for connections the
// HTTP verdict closed: one map read when there are none. A closed
// connection's client waits at most this long (after its last answer)
// to learn it is closed.
const resetClosedHTTPEvery = 100 * time.Millisecond

// resetClosedHTTP resets the connections the node's HTTP verdict closed
// once their last answers have gone (datapath.ResetClosedL7), so neither
// the client nor the server waits on a connection that carries nothing
// more, until ctx ends.
func (a *Agent) resetClosedHTTP(ctx context.Context) {
	every(ctx, resetClosedHTTPEvery, func() {
		if !a.dp.L7ResetPending() {
			return
		}
		if _, err := a.dp.ResetClosedL7(a.podNetNSByAddr()); err != nil {
			a.log.Warn("reset closed HTTP connections", "err", err)
		}
	})
}

// podNetNSByAddr looks up the network namespace of the local pod holding
// an address, in the leases as they are now.
func (a *Agent) podNetNSByAddr() func(netip.Addr) (string, bool) {
	byAddr := map[netip.Addr]string{}
	for _, l := range a.ipam.List() {
		if l.NetNS != "" {
			byAddr[l.Addr] = l.NetNS
		}
	}
	return func(addr netip.Addr) (string, bool) {
		p, ok := byAddr[addr]
		return p, ok
	}
}

package agent

import (
	"net/netip"
	"testing"

	"github.com/weirnet/weir/internal/service"
)

// A record names the Service of the frontend the client named; a node
// address or loopback finds a NodePort's any-node entry, any other
// address does not; a frontend written away names nothing.
func TestServiceNamesFollowTheWrites(t *testing.T) {
	var s serviceNames
	clusterIP := service.Frontend{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Proto: 6}
	nodePort := service.Frontend{Addr: service.AnyNode, Port: 30080, Proto: 6}
	outside := service.Frontend{Addr: netip.MustParseAddr("10.99.0.11"), Port: 30081, Proto: 6, External: true}
	owner := map[service.Frontend]string{clusterIP: "default/web", nodePort: "default/np", outside: "default/ext"}
	s.written(nil, service.Table{clusterIP: {}, nodePort: {}, outside: {}}, true, func(f service.Frontend) string { return owner[f] })
	s.setNodeAddrs([]netip.Addr{netip.MustParseAddr("10.99.0.11")})
	for addr, want := range map[string]string{
		"10.96.0.10:80":    "default/web",
		"10.99.0.11:30080": "default/np",
		"127.0.0.1:30080":  "default/np",
		"10.99.0.11:30081": "default/ext", // a flow from outside
		"10.96.0.11:30080": "",            // no node address: a ClusterIP, and none has that port
		"10.96.0.10:81":    "",
	} {
		if got := s.name(netip.MustParseAddrPort(addr), 6); got != want {
			t.Errorf("%s names %q, want %q", addr, got, want)
		}
	}
	s.written(service.Table{clusterIP: {}}, nil, false, func(f service.Frontend) string { return owner[f] })
	if got := s.name(netip.MustParseAddrPort("10.96.0.10:80"), 6); got != "" {
		t.Errorf("a frontend written away still names %q", got)
	}
	if got := s.name(netip.MustParseAddrPort("10.99.0.11:30080"), 6); got != "default/np" {
		t.Errorf("a partial write lost the other names: %q", got)
	}
}

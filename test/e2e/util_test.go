package e2e

import (
	"net"
	"net/netip"
)

func mustAddr(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip.To4())
	return a
}

package testutil

import (
	"errors"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// LoopbackBound is a net.Dialer Control that binds the socket to
// 127.0.0.1 on a port the kernel picks and calls before with that
// address before the SYN leaves: a test records the connection (as tc
// would on its SYN) under the client's own four-tuple.
func LoopbackBound(before func(netip.AddrPort) error) func(string, string, syscall.RawConn) error {
	return func(_, _ string, rc syscall.RawConn) error {
		var err error
		cerr := rc.Control(func(fd uintptr) {
			if err = unix.Bind(int(fd), &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
				return
			}
			var sa unix.Sockaddr
			if sa, err = unix.Getsockname(int(fd)); err != nil {
				return
			}
			err = before(netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(sa.(*unix.SockaddrInet4).Port)))
		})
		return errors.Join(cerr, err)
	}
}

package testutil

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// Frames a pod with CAP_NET_RAW can put on its link, for tests that try
// what the datapath must refuse. Checksums are valid, so a frame that gets
// through is one the receiving stack accepts.

// EtherTypes used by the builders.
const (
	EtherIPv4   = 0x0800
	EtherIPv6   = 0x86dd
	Ether8021Q  = 0x8100
	Ether8021AD = 0x88a8
)

// Ethernet returns a frame header.
func Ethernet(dst, src net.HardwareAddr, etherType uint16) []byte {
	b := make([]byte, 14)
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:14], etherType)
	return b
}

// VLANTagged inserts an 802.1Q (or with tpid 0x88a8, 802.1ad) tag with
// the given VLAN ID after the MAC addresses of frame.
func VLANTagged(frame []byte, tpid, vid uint16) []byte {
	out := append([]byte{}, frame[:12]...)
	tag := make([]byte, 4)
	binary.BigEndian.PutUint16(tag[0:2], tpid)
	binary.BigEndian.PutUint16(tag[2:4], vid&0x0fff)
	out = append(out, tag...)
	return append(out, frame[12:]...)
}

// Checksum is the Internet checksum of b.
func Checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// IPv4UDP is an Ethernet/IPv4/UDP frame (UDP checksum 0: none).
func IPv4UDP(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], uint16(20+8+len(payload)))
	ip[8] = 64
	ip[9] = unix.IPPROTO_UDP
	s, d := src.As4(), dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	binary.BigEndian.PutUint16(ip[10:12], Checksum(ip))
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:2], sport)
	binary.BigEndian.PutUint16(udp[2:4], dport)
	binary.BigEndian.PutUint16(udp[4:6], uint16(8+len(payload)))
	frame := append(Ethernet(dstMAC, srcMAC, EtherIPv4), ip...)
	frame = append(frame, udp...)
	return append(frame, payload...)
}

// IPv6ICMP is an Ethernet/IPv6/ICMPv6 frame with hop limit 255 (as
// neighbour discovery requires) and a valid checksum; body follows the
// 4-byte ICMPv6 header.
func IPv6ICMP(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, typ, code uint8, body []byte) []byte {
	icmp := append([]byte{typ, code, 0, 0}, body...)
	s, d := src.As16(), dst.As16()
	pseudo := append(append([]byte{}, s[:]...), d[:]...)
	pseudo = binary.BigEndian.AppendUint32(pseudo, uint32(len(icmp)))
	pseudo = append(pseudo, 0, 0, 0, unix.IPPROTO_ICMPV6)
	binary.BigEndian.PutUint16(icmp[2:4], Checksum(append(pseudo, icmp...)))
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:6], uint16(len(icmp)))
	ip[6] = unix.IPPROTO_ICMPV6
	ip[7] = 255
	copy(ip[8:24], s[:])
	copy(ip[24:40], d[:])
	frame := append(Ethernet(dstMAC, srcMAC, EtherIPv6), ip...)
	return append(frame, icmp...)
}

// RouterAdvertisement is an ICMPv6 router advertisement (type 134) from
// src to all nodes: a default router for lifetime seconds and an
// autonomous on-link prefix, so a host that accepts it gains a default
// route and an address in prefix.
func RouterAdvertisement(srcMAC net.HardwareAddr, src netip.Addr, prefix netip.Prefix, lifetime uint16) []byte {
	body := make([]byte, 12)
	body[0] = 64                                    // current hop limit
	binary.BigEndian.PutUint16(body[2:4], lifetime) // router lifetime
	// Prefix information option (type 3, 4 x 8 bytes): on-link, autonomous.
	pi := make([]byte, 32)
	pi[0], pi[1] = 3, 4
	pi[2] = uint8(prefix.Bits())
	pi[3] = 0xc0
	binary.BigEndian.PutUint32(pi[4:8], 86400)
	binary.BigEndian.PutUint32(pi[8:12], 14400)
	a := prefix.Masked().Addr().As16()
	copy(pi[16:32], a[:])
	// Source link-layer address option (type 1, 1 x 8 bytes).
	sll := append([]byte{1, 1}, srcMAC...)
	body = append(append(body, pi...), sll...)
	allNodes := netip.MustParseAddr("ff02::1")
	return IPv6ICMP(net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, srcMAC, src, allNodes, 134, 0, body)
}

// SendFrames writes frames unchanged onto the link ifName of the calling
// thread's namespace through an AF_PACKET socket, as a pod with
// CAP_NET_RAW can.
func SendFrames(ifName string, frames ...[]byte) error {
	ifi, err := net.InterfaceByName(ifName)
	if err != nil {
		return fmt.Errorf("find %s: %w", ifName, err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
	if err != nil {
		return fmt.Errorf("open packet socket: %w", err)
	}
	defer unix.Close(fd)
	for _, f := range frames {
		sa := &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6}
		copy(sa.Addr[:], f[0:6])
		if err := unix.Sendto(fd, f, 0, sa); err != nil {
			return fmt.Errorf("send %d-byte frame on %s: %w", len(f), ifName, err)
		}
	}
	return nil
}

// IPv4WithOption returns an Ethernet/IPv4 frame with opt (a whole number
// of 4-byte words) inserted as the first IPv4 option, the header length,
// total length and header checksum adjusted.
func IPv4WithOption(frame, opt []byte) []byte {
	const l3 = 14
	ihl := int(frame[l3]&0xf) * 4
	out := append(append(append([]byte{}, frame[:l3+20]...), opt...), frame[l3+20:]...)
	out[l3] = 0x40 | byte((ihl+len(opt))/4)
	binary.BigEndian.PutUint16(out[l3+2:], binary.BigEndian.Uint16(out[l3+2:])+uint16(len(opt)))
	binary.BigEndian.PutUint16(out[l3+10:], 0)
	binary.BigEndian.PutUint16(out[l3+10:], Checksum(out[l3:l3+ihl+len(opt)]))
	return out
}

// Capture is an AF_PACKET socket reading every IPv4 frame that reaches
// one link of the namespace it was opened in.
type Capture struct{ fd int }

// OpenCapture starts capturing on ifName of the calling thread's namespace.
func OpenCapture(ifName string) (*Capture, error) {
	ifi, err := net.InterfaceByName(ifName)
	if err != nil {
		return nil, fmt.Errorf("find %s: %w", ifName, err)
	}
	proto := binary.NativeEndian.Uint16([]byte{0x08, 0x00}) // ETH_P_IP in network order
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(proto))
	if err != nil {
		return nil, fmt.Errorf("open packet socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind packet socket to %s: %w", ifName, err)
	}
	return &Capture{fd: fd}, nil
}

// Next returns the next captured frame for which match is true, or an
// error once timeout passes without one.
func (c *Capture) Next(timeout time.Duration, match func([]byte) bool) ([]byte, error) {
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 65536)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return nil, fmt.Errorf("no matching frame within %v", timeout)
		}
		tv := unix.NsecToTimeval(left.Nanoseconds())
		if err := unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return nil, fmt.Errorf("set capture timeout: %w", err)
		}
		k, _, err := unix.Recvfrom(c.fd, buf, 0)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("capture: %w", err)
		}
		if match(buf[:k]) {
			return append([]byte{}, buf[:k]...), nil
		}
	}
}

// Close stops the capture.
func (c *Capture) Close() error { return unix.Close(c.fd) }

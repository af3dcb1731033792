package datapath

import (
	"encoding/binary"
	"net"
	"net/netip"

	"github.com/weirnet/weir/internal/testutil"
)

// Crafted frames for BPF_PROG_RUN tests.

const (
	etherTypeIPv4 = 0x0800
	etherTypeARP  = 0x0806
	etherTypeIPv6 = 0x86dd
)

func ethHeader(dst, src net.HardwareAddr, etherType uint16) []byte {
	return testutil.Ethernet(dst, src, etherType)
}

// udpFrame is an Ethernet/IPv4/UDP frame with a valid IPv4 checksum,
// from port 40000 to 7777.
func udpFrame(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, payload []byte) []byte {
	return testutil.IPv4UDP(dstMAC, srcMAC, src, dst, 40000, 7777, payload)
}

// arpRequest asks who has target, from sender (MAC smac).
func arpRequest(smac net.HardwareAddr, sender, target netip.Addr) []byte {
	b := make([]byte, 28)
	binary.BigEndian.PutUint16(b[0:2], 1)      // Ethernet
	binary.BigEndian.PutUint16(b[2:4], 0x0800) // IPv4
	b[4], b[5] = 6, 4
	binary.BigEndian.PutUint16(b[6:8], 1) // request
	copy(b[8:14], smac)
	s, t := sender.As4(), target.As4()
	copy(b[14:18], s[:])
	copy(b[24:28], t[:])
	frame := append(ethHeader(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, smac, etherTypeARP), b...)
	// Pad to the Ethernet minimum as a NIC would.
	return append(frame, make([]byte, 60-len(frame))...)
}

// ipChecksum is the Internet checksum (trace_frame.go); a header with a
// valid checksum sums to zero.
func ipChecksum(h []byte) uint16 { return onesComplement(h) }

// TCP flags.
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// tcpFrame is an Ethernet/IPv4/TCP segment with valid checksums and a
// 20-byte TCP header.
func tcpFrame(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, sport, dport uint16, seq uint32, flags uint8, payload []byte) []byte {
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], uint16(20+20+len(payload)))
	ip[8] = 64
	ip[9] = 6 // TCP
	s, d := src.As4(), dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	binary.BigEndian.PutUint16(ip[10:12], ipChecksum(ip))
	tcp := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(tcp[0:2], sport)
	binary.BigEndian.PutUint16(tcp[2:4], dport)
	binary.BigEndian.PutUint32(tcp[4:8], seq)
	tcp[12] = 5 << 4
	tcp[13] = flags
	binary.BigEndian.PutUint16(tcp[14:16], 64240)
	tcp = append(tcp, payload...)
	binary.BigEndian.PutUint16(tcp[16:18], l4Checksum(src, dst, 6, tcp))
	frame := append(ethHeader(dstMAC, srcMAC, etherTypeIPv4), ip...)
	return append(frame, tcp...)
}

// l4Checksum is the TCP/UDP checksum of seg (its checksum field zero, or
// in place: a segment with a valid checksum sums to zero).
func l4Checksum(src, dst netip.Addr, proto uint8, seg []byte) uint16 {
	return pseudoChecksum(TracePacket{Src: src, Dst: dst, Proto: proto}, seg)
}

// asFragment sets the IP ID and fragment fields of an Ethernet/IPv4
// frame (offset in 8-byte units) and fixes its header checksum.
func asFragment(frame []byte, id uint16, offset uint16, more bool) []byte {
	ip := frame[14:34]
	binary.BigEndian.PutUint16(ip[4:6], id)
	fo := offset & 0x1fff
	if more {
		fo |= 0x2000
	}
	binary.BigEndian.PutUint16(ip[6:8], fo)
	binary.BigEndian.PutUint16(ip[10:12], 0)
	binary.BigEndian.PutUint16(ip[10:12], ipChecksum(ip))
	return frame
}

// laterFragment is a non-first fragment of a datagram: an IPv4 header
// and payload bytes, no transport header.
func laterFragment(src, dst netip.Addr, proto uint8, id, offset uint16, more bool, payload []byte) []byte {
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], uint16(20+len(payload)))
	ip[8] = 64
	ip[9] = proto
	s, d := src.As4(), dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	frame := append(ethHeader(hostMAC, podMAC, etherTypeIPv4), ip...)
	frame = append(frame, payload...)
	return asFragment(frame, id, offset, more)
}

// icmpError is an ICMP error of type/code from src to dst quoting the IP
// header and first 8 bytes of the Ethernet/IPv4 frame about.
func icmpError(src, dst netip.Addr, typ, code uint8, about []byte) []byte {
	return icmpErrorFrame(podMAC, src, dst, typ, code, 0, about[14:14+28])
}

// icmpErrorFrame is an Ethernet/IPv4 ICMP error of type/code from src
// (MAC srcMAC) to dst, its header's second word rest, quoting quote.
func icmpErrorFrame(srcMAC net.HardwareAddr, src, dst netip.Addr, typ, code uint8, rest uint32, quote []byte) []byte {
	icmp := append(binary.BigEndian.AppendUint32([]byte{typ, code, 0, 0}, rest), quote...)
	binary.BigEndian.PutUint16(icmp[2:4], onesComplement(icmp))
	ip := make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], uint16(20+len(icmp)))
	ip[8] = 64
	ip[9] = 1 // ICMP
	s, d := src.As4(), dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	binary.BigEndian.PutUint16(ip[10:12], ipChecksum(ip))
	frame := append(ethHeader(hostMAC, srcMAC, etherTypeIPv4), ip...)
	return append(frame, icmp...)
}

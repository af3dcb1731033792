package datapath

import (
	"encoding/binary"
	"fmt"
)

// traceMAC is the source and destination MAC of traced frames. No
// program checks the MACs of what it receives (from_overlay accepts any).
var traceMAC = [6]byte{0x02, 0x57, 0x45, 0x49, 0x52, 0x01}

// traceFrame builds the first packet of p's flow: Ethernet, IPv4 with a
// valid checksum, and a TCP SYN, a UDP datagram or an ICMP echo request
// with a valid checksum.
func traceFrame(p TracePacket) ([]byte, error) {
	if !p.Src.Is4() || !p.Dst.Is4() {
		return nil, fmt.Errorf("%v -> %v: only IPv4 is traced: %w", p.Src, p.Dst, ErrTraceUnsupported)
	}
	var l4 []byte
	switch p.Proto {
	case 6:
		l4 = make([]byte, 20)
		binary.BigEndian.PutUint16(l4[0:2], traceSourcePort)
		binary.BigEndian.PutUint16(l4[2:4], p.Port)
		binary.BigEndian.PutUint32(l4[4:8], 1)
		l4[12] = 5 << 4
		l4[13] = 0x02 // SYN
		binary.BigEndian.PutUint16(l4[14:16], 64240)
		binary.BigEndian.PutUint16(l4[16:18], pseudoChecksum(p, l4))
	case 17:
		l4 = make([]byte, 8+4)
		binary.BigEndian.PutUint16(l4[0:2], traceSourcePort)
		binary.BigEndian.PutUint16(l4[2:4], p.Port)
		binary.BigEndian.PutUint16(l4[4:6], uint16(len(l4)))
		copy(l4[8:], "weir")
		binary.BigEndian.PutUint16(l4[6:8], pseudoChecksum(p, l4))
	case 1:
		l4 = make([]byte, 8)
		l4[0] = 8                                   // echo request
		binary.BigEndian.PutUint16(l4[4:6], 0x5745) // identifier
		binary.BigEndian.PutUint16(l4[6:8], 1)
		binary.BigEndian.PutUint16(l4[2:4], onesComplement(l4))
	default:
		return nil, fmt.Errorf("protocol %d: %w", p.Proto, ErrTraceUnsupported)
	}
	frame := make([]byte, 14+20, 14+20+len(l4))
	copy(frame[0:6], traceMAC[:])
	copy(frame[6:12], traceMAC[:])
	binary.BigEndian.PutUint16(frame[12:14], 0x0800)
	ip := frame[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], uint16(20+len(l4)))
	ip[8] = 64
	ip[9] = p.Proto
	s, d := p.Src.As4(), p.Dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	binary.BigEndian.PutUint16(ip[10:12], onesComplement(ip))
	return append(frame, l4...), nil
}

// pseudoChecksum is the TCP or UDP checksum of seg (checksum field zero).
func pseudoChecksum(p TracePacket, seg []byte) uint16 {
	s, d := p.Src.As4(), p.Dst.As4()
	buf := make([]byte, 0, 12+len(seg)+1)
	buf = append(buf, s[:]...)
	buf = append(buf, d[:]...)
	buf = append(buf, 0, p.Proto, byte(len(seg)>>8), byte(len(seg)))
	buf = append(buf, seg...)
	return onesComplement(buf)
}

// onesComplement is the Internet checksum of b.
func onesComplement(b []byte) uint16 {
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

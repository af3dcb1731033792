package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/weirnet/weir/internal/service"
)

// icmpErrorOf is an ICMP error of type/code from src to dst quoting the
// whole IP packet of the Ethernet/IPv4 frame about, with a next-hop MTU
// of 1500.
func icmpErrorOf(src, dst netip.Addr, typ, code uint8, about []byte) []byte {
	return icmpErrorFrame(peerHW, src, dst, typ, code, 1500, about[14:])
}

// quoted reads an ICMP error frame: its outer addresses and the quoted
// packet's addresses and ports, checking the outer IP, ICMP, quoted IP
// and quoted TCP or UDP checksums.
func quoted(t *testing.T, frame []byte) (outerSrc, outerDst netip.Addr, src, dst netip.AddrPort) {
	t.Helper()
	ip := frame[14:34]
	if ipChecksum(ip) != 0 {
		t.Errorf("outer IPv4 checksum wrong")
	}
	icmp := frame[34 : 14+int(binary.BigEndian.Uint16(ip[2:4]))]
	if onesComplement(icmp) != 0 {
		t.Errorf("ICMP checksum wrong")
	}
	in := icmp[8:28]
	if ipChecksum(in) != 0 {
		t.Errorf("quoted IPv4 checksum wrong")
	}
	s, d := netip.AddrFrom4([4]byte(in[12:16])), netip.AddrFrom4([4]byte(in[16:20]))
	seg := icmp[28:]
	if len(seg) == int(binary.BigEndian.Uint16(in[2:4]))-20 && l4Checksum(s, d, in[9], seg) != 0 {
		t.Errorf("quoted %d checksum wrong", in[9])
	}
	return netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20])),
		netip.AddrPortFrom(s, binary.BigEndian.Uint16(seg[0:2])), netip.AddrPortFrom(d, binary.BigEndian.Uint16(seg[2:4]))
}

// TestNodePortICMPErrorsFollowTheFlow: ICMP errors about a NodePort flow
// are translated with it, the quoted packet too, with every checksum
// right: a "fragmentation needed" from a router outside about a reply
// (quoting the NodePort) goes to the backend quoting the backend, marked
// for SNAT when the backend is remote; one the backend sends the client
// about a request comes from the NodePort quoting the NodePort, and one a
// router on the way sends keeps its sender; errors about no translated
// flow are left alone.
func TestNodePortICMPErrorsFollowTheFlow(t *testing.T) {
	p := loadTestWith(t, ModeVXLAN, func(c *ProgramConfig) { c.ExternalServices = true })
	if err := (&Node{progs: p}).SetServices(nodePortTable()); err != nil {
		t.Fatal(err)
	}
	for _, port := range []uint16{30080, 30081} {
		if ret, _, _ := runCtx(t, p.FromNetdev, tcpFrame(hostMAC, peerHW, outside, nodeAddr, 40001, port, 1, tcpSYN, nil), 3); ret != tcActOK {
			t.Fatalf("SYN to %d: %s", port, tcVerdictName(ret))
		}
	}
	router := netip.MustParseAddr("198.51.100.1")
	reply := tcpFrame(peerHW, hostMAC, nodeAddr, outside, 30080, 40001, 7, tcpSYN|tcpACK, nil)

	// From outside, about a reply: to the backend.
	ret, out, ctx := runCtx(t, p.FromNetdev, icmpErrorOf(router, nodeAddr, 3, 4, reply), 3)
	os, od, qs, qd := quoted(t, out)
	if ret != tcActOK || os != router || od != podA || qs != netip.AddrPortFrom(podA, 8080) || qd != netip.AddrPortFrom(outside, 40001) {
		t.Errorf("error about a reply: %s %v -> %v quoting %v -> %v, want ok %v -> %v quoting %v:8080 -> %v:40001",
			tcVerdictName(ret), os, od, qs, qd, router, podA, podA, outside)
	}
	if ctx.Mark&nodePortSNATMark != 0 {
		t.Errorf("error for a local backend marked for SNAT")
	}
	remoteReply := tcpFrame(peerHW, hostMAC, nodeAddr, outside, 30081, 40001, 7, tcpSYN|tcpACK, nil)
	_, out, ctx = runCtx(t, p.FromNetdev, icmpErrorOf(router, nodeAddr, 3, 4, remoteReply), 3)
	if _, od, qs, _ := quoted(t, out); od != remote || qs != netip.AddrPortFrom(remote, 8080) || ctx.Mark&nodePortSNATMark == 0 {
		t.Errorf("error about a remote backend's reply: to %v quoting %v, mark %#x; want %v, %v:8080, marked for SNAT", od, qs, ctx.Mark, remote, remote)
	}

	// Leaving for the client, about a request the backend got.
	request := tcpFrame(hostMAC, peerHW, outside, podA, 40001, 8080, 1, tcpSYN, nil)
	ret, out, _ = runCtx(t, p.ToNetdev, icmpErrorOf(podA, outside, 3, 3, request), 0)
	os, od, qs, qd = quoted(t, out)
	if ret != tcActOK || os != nodeAddr || od != outside || qs != netip.AddrPortFrom(outside, 40001) || qd != netip.AddrPortFrom(nodeAddr, 30080) {
		t.Errorf("the backend's error: %s %v -> %v quoting %v -> %v, want ok %v -> %v quoting %v:40001 -> %v:30080",
			tcVerdictName(ret), os, od, qs, qd, nodeAddr, outside, outside, nodeAddr)
	}
	_, out, _ = runCtx(t, p.ToNetdev, icmpErrorOf(router, outside, 11, 0, request), 0)
	if os, _, _, qd := quoted(t, out); os != router || qd != netip.AddrPortFrom(nodeAddr, 30080) {
		t.Errorf("a router's error: from %v quoting %v, want from %v quoting the NodePort", os, qd, router)
	}

	// About no translated flow: untouched.
	stranger := tcpFrame(hostMAC, peerHW, outside, podA, 40999, 8080, 1, tcpSYN, nil)
	_, out, _ = runCtx(t, p.ToNetdev, icmpErrorOf(podA, outside, 3, 3, stranger), 0)
	if os, _, _, qd := quoted(t, out); os != podA || qd != netip.AddrPortFrom(podA, 8080) {
		t.Errorf("an error about no translated flow was rewritten: from %v quoting %v", os, qd)
	}
	_, out, _ = runCtx(t, p.FromNetdev, icmpErrorOf(router, nodeAddr, 3, 4, tcpFrame(peerHW, hostMAC, nodeAddr, outside, 22, 40001, 7, tcpACK, nil)), 3)
	if _, od, _, _ := quoted(t, out); od != nodeAddr {
		t.Errorf("an error about the node's own reply was sent to %v", od)
	}
}

// udpDatagram is an IPv4/UDP packet (after an Ethernet header) with a
// valid UDP checksum.
func udpDatagram(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	udp := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:2], sport)
	binary.BigEndian.PutUint16(udp[2:4], dport)
	binary.BigEndian.PutUint16(udp[4:6], uint16(8+len(payload)))
	udp = append(udp, payload...)
	binary.BigEndian.PutUint16(udp[6:8], l4Checksum(src, dst, 17, udp))
	return udp
}

// fragments splits a UDP datagram into a first fragment of the first n
// bytes (n a multiple of 8) and a last one of the rest.
func fragments(src, dst netip.Addr, id uint16, udp []byte, n int) (first, last []byte) {
	first = laterFragment(src, dst, 17, id, 0, true, udp[:n])
	last = laterFragment(src, dst, 17, id, uint16(n/8), false, udp[n:])
	return first, last
}

// TestNodePortFragmentsFollowTheirFirst: a fragmented datagram to a UDP
// NodePort goes whole to the backend (its first fragment as any packet
// of the flow, the later ones after it), and the backend's fragmented
// reply leaves whole from the NodePort: addresses, ports and checksums
// as one datagram. A later fragment of a datagram whose first never came
// is left alone.
func TestNodePortFragmentsFollowTheirFirst(t *testing.T) {
	p := loadTestWith(t, ModeVXLAN, func(c *ProgramConfig) { c.ExternalServices = true })
	udpFE := service.Frontend{Addr: nodeAddr, Port: 30085, Proto: service.ProtoUDP, External: true}
	if err := (&Node{progs: p}).SetServices(service.Table{udpFE: {Backends: []service.Backend{{Addr: podA, Port: 5353}}}}); err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 3000)
	for i := range payload {
		payload[i] = byte(i)
	}
	whole := func(first, last []byte) (src, dst netip.AddrPort) {
		t.Helper()
		for _, f := range [][]byte{first, last} {
			if ipChecksum(f[14:34]) != 0 {
				t.Errorf("fragment IPv4 checksum wrong")
			}
		}
		s, d := netip.AddrFrom4([4]byte(first[26:30])), netip.AddrFrom4([4]byte(first[30:34]))
		if ls, ld := netip.AddrFrom4([4]byte(last[26:30])), netip.AddrFrom4([4]byte(last[30:34])); ls != s || ld != d {
			t.Errorf("fragments of one datagram went apart: %v -> %v and %v -> %v", s, d, ls, ld)
		}
		udp := append(append([]byte{}, first[34:]...), last[34:]...)
		if l4Checksum(s, d, 17, udp) != 0 {
			t.Errorf("the datagram's UDP checksum is wrong")
		}
		return netip.AddrPortFrom(s, binary.BigEndian.Uint16(udp[0:2])), netip.AddrPortFrom(d, binary.BigEndian.Uint16(udp[2:4]))
	}

	first, last := fragments(outside, nodeAddr, 7, udpDatagram(outside, nodeAddr, 40000, 30085, payload), 1480)
	r1, f1, _ := runCtx(t, p.FromNetdev, first, 3)
	r2, f2, _ := runCtx(t, p.FromNetdev, last, 3)
	if src, dst := whole(f1, f2[:len(last)]); r1 != tcActOK || r2 != tcActOK || src != netip.AddrPortFrom(outside, 40000) || dst != netip.AddrPortFrom(podA, 5353) {
		t.Errorf("fragmented request: %s/%s %v -> %v, want ok %v:40000 -> %v:5353", tcVerdictName(r1), tcVerdictName(r2), src, dst, outside, podA)
	}

	first, last = fragments(podA, outside, 9, udpDatagram(podA, outside, 5353, 40000, payload), 1480)
	r1, f1, _ = runCtx(t, p.ToNetdev, first, 0)
	r2, f2, _ = runCtx(t, p.ToNetdev, last, 0)
	if src, dst := whole(f1, f2[:len(last)]); r1 != tcActOK || r2 != tcActOK || src != netip.AddrPortFrom(nodeAddr, 30085) || dst != netip.AddrPortFrom(outside, 40000) {
		t.Errorf("fragmented reply: %s/%s %v -> %v, want ok %v:30085 -> %v:40000", tcVerdictName(r1), tcVerdictName(r2), src, dst, nodeAddr, outside)
	}

	orphan := laterFragment(outside, nodeAddr, 17, 99, 185, false, payload[:100])
	if _, out, _ := runCtx(t, p.FromNetdev, orphan, 3); netip.AddrFrom4([4]byte(out[30:34])) != nodeAddr {
		t.Errorf("a later fragment without its first was sent to %v", netip.AddrFrom4([4]byte(out[30:34])))
	}
}

package datapath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/weirnet/weir/internal/datapath/bpffs"
	"github.com/weirnet/weir/internal/testutil"
)

var (
	podMAC  = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	hostMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xfe}
	peerMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
	peerHW  = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xfd}
	podA    = netip.MustParseAddr("10.244.1.2")
	podB    = netip.MustParseAddr("10.244.1.3")
	remote  = netip.MustParseAddr("10.244.2.7")
	outside = netip.MustParseAddr("192.0.2.10")
	gateway = netip.MustParseAddr("10.244.1.1")
)

const (
	ifA = 11 // host-side ifindex of pod A
	ifB = 12 // host-side ifindex of pod B
)

// loadTest loads the programs with test maps: pod A and B local, the /24
// of remote owned by node 10.99.0.12.
func loadTest(t *testing.T, mode Mode) *Programs {
	t.Helper()
	return loadTestWith(t, mode, nil)
}

// loadTestWith is loadTest with the config changed by change first.
func loadTestWith(t *testing.T, mode Mode, change func(*ProgramConfig)) *Programs {
	t.Helper()
	testutil.RequireRoot(t)
	dir := testutil.BPFDir(t)
	if _, err := bpffs.Ensure(dir); err != nil {
		t.Fatal(err)
	}
	cfg := ProgramConfig{Mode: mode, OverlayIfindex: 99, PodCIDR: netip.MustParsePrefix("10.244.1.0/24"), ClusterCIDR: netip.MustParsePrefix("10.244.0.0/16"), PinDir: dir, senderFromCB: true}
	if change != nil {
		change(&cfg)
	}
	p, err := LoadPrograms(cfg)
	if err != nil {
		t.Fatalf("load programs: %v", err)
	}
	t.Cleanup(p.Close)
	em := endpointMap{p.Endpoints}
	for _, e := range []EndpointEntry{
		{Addr: podA, HostIfindex: ifA, PodMAC: podMAC, HostMAC: hostMAC},
		{Addr: podB, HostIfindex: ifB, PodMAC: peerMAC, HostMAC: peerHW},
	} {
		if err := em.put(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := (tunnelMap{p.Tunnels}).put(netip.MustParsePrefix("10.244.2.0/24"), netip.MustParseAddr("10.99.0.12")); err != nil {
		t.Fatal(err)
	}
	return p
}

func run(t *testing.T, prog *ebpf.Program, frame []byte, ingress uint32) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(frame)+256)
	opts := &ebpf.RunOptions{Data: frame, DataOut: out, Context: skbCtx{IngressIfindex: ingress}}
	ret, err := prog.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_RUN: %v", err)
	}
	return ret, opts.DataOut
}

func metric(t *testing.T, p *Programs, name string) uint64 {
	t.Helper()
	m, err := readMetrics(p.Metrics)
	if err != nil {
		t.Fatal(err)
	}
	return m[name]
}

func TestFromContainerDeliversLocally(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	ret, out := run(t, p.FromContainer, udpFrame(hostMAC, podMAC, podA, podB, []byte("hi")), ifA)
	if ret != tcActRedirect {
		t.Fatalf("verdict %d, want redirect (%d)", ret, tcActRedirect)
	}
	// The frame is rewritten as a router would: from B's gateway to B.
	if !bytes.Equal(out[0:6], peerMAC) || !bytes.Equal(out[6:12], peerHW) {
		t.Fatalf("MACs after delivery: dst %v src %v, want %v %v", net.HardwareAddr(out[0:6]), net.HardwareAddr(out[6:12]), peerMAC, peerHW)
	}
	if got := metric(t, p, "redirect_local"); got != 1 {
		t.Fatalf("redirect_local = %d, want 1", got)
	}
}

func TestFromContainerDropsSpoofedSource(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	cases := map[string]struct {
		src     netip.Addr
		ingress uint32
	}{
		"unknown address":       {netip.MustParseAddr("10.244.1.99"), ifA},
		"another pod's address": {podB, ifA},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			ret, _ := run(t, p.FromContainer, udpFrame(hostMAC, podMAC, c.src, remote, nil), c.ingress)
			if ret != tcActShot {
				t.Fatalf("verdict %d, want drop", ret)
			}
		})
	}
	if got := metric(t, p, "drop_spoof"); got != 2 {
		t.Fatalf("drop_spoof = %d, want 2", got)
	}
}

func TestFromContainerTunnelsToRemoteNode(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	ret, _ := run(t, p.FromContainer, udpFrame(hostMAC, podMAC, podA, remote, nil), ifA)
	if ret != tcActRedirect {
		t.Fatalf("verdict %d, want redirect to the overlay", ret)
	}
	if got := metric(t, p, "redirect_tunnel"); got != 1 {
		t.Fatalf("redirect_tunnel = %d, want 1", got)
	}
}

func TestFromContainerPassesOutsideTrafficToHost(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	frame := udpFrame(hostMAC, podMAC, podA, outside, nil)
	ret, out := run(t, p.FromContainer, frame, ifA)
	if ret != tcActOK || !bytes.Equal(out[:len(frame)], frame) {
		t.Fatalf("verdict %d (want pass, unmodified)", ret)
	}
}

// TestFromContainerFiltersLinkFrames: of what is not IPv4 or ARP, only
// IPv6 neighbour discovery reaches the node; router advertisements,
// redirects, other IPv6, tagged frames and other EtherTypes are dropped
// and counted by reason. (A tag the stack strips before tcx is tried with
// real frames in internal/agent.)
func TestFromContainerFiltersLinkFrames(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	ll, allNodes := netip.MustParseAddr("fe80::1"), netip.MustParseAddr("ff02::1")
	nd := func(typ uint8) []byte {
		return testutil.IPv6ICMP(hostMAC, podMAC, ll, allNodes, typ, 0, make([]byte, 20))
	}
	hop64 := nd(135)
	hop64[14+7] = 64 // a forwarded solicitation is no neighbour discovery
	udp6 := append(ethHeader(hostMAC, podMAC, etherTypeIPv6), make([]byte, 48)...)
	udp6[14] = 0x60
	udp6[14+6], udp6[14+7] = 17, 255
	cases := []struct {
		name   string
		frame  []byte
		want   uint32
		metric string
	}{
		{"neighbour solicitation", nd(135), tcActOK, "pass_host"},
		{"neighbour advertisement", nd(136), tcActOK, "pass_host"},
		{"router solicitation", nd(133), tcActShot, "drop_ipv6"},
		{"router advertisement", testutil.RouterAdvertisement(podMAC, ll, netip.MustParsePrefix("2001:db8::/64"), 1800), tcActShot, "drop_ipv6"},
		{"redirect", nd(137), tcActShot, "drop_ipv6"},
		{"MLD report", nd(143), tcActShot, "drop_ipv6"},
		{"solicitation with hop limit 64", hop64, tcActShot, "drop_ipv6"},
		{"IPv6 UDP", udp6, tcActShot, "drop_ipv6"},
		{"802.1Q tagged IPv4", testutil.VLANTagged(udpFrame(hostMAC, podMAC, podA, outside, nil), testutil.Ether8021Q, 0), tcActShot, "drop_vlan"},
		{"802.1ad tagged IPv4", testutil.VLANTagged(udpFrame(hostMAC, podMAC, podA, outside, nil), testutil.Ether8021AD, 7), tcActShot, "drop_vlan"},
		{"LLDP", append(ethHeader(hostMAC, podMAC, 0x88cc), make([]byte, 46)...), tcActShot, "drop_ethertype"},
		{"IPv4 limited broadcast", udpFrame(hostMAC, podMAC, podA, netip.MustParseAddr("255.255.255.255"), nil), tcActShot, "drop_broadcast"},
		{"IPv4 multicast", udpFrame(hostMAC, podMAC, podA, netip.MustParseAddr("224.0.0.251"), nil), tcActShot, "drop_broadcast"},
	}
	for _, c := range cases {
		before := metric(t, p, c.metric)
		if ret, _ := run(t, p.FromContainer, c.frame, ifA); ret != c.want {
			t.Errorf("%s: verdict %d, want %d", c.name, ret, c.want)
		}
		if got := metric(t, p, c.metric) - before; got != 1 {
			t.Errorf("%s: %s grew by %d, want 1", c.name, c.metric, got)
		}
	}
}

func TestFromContainerDropsMalformedIPv4(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	frame := udpFrame(hostMAC, podMAC, podA, podB, nil)
	frame[14] = 0x43 // IHL 3: shorter than any IPv4 header
	if ret, _ := run(t, p.FromContainer, frame, ifA); ret != tcActShot {
		t.Fatalf("verdict %d, want drop", ret)
	}
	if got := metric(t, p, "drop_malformed"); got != 1 {
		t.Fatalf("drop_malformed = %d, want 1", got)
	}
}

func TestFromContainerAnswersARP(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	ret, out := run(t, p.FromContainer, arpRequest(podMAC, podA, gateway), ifA)
	if ret != tcActRedirect {
		t.Fatalf("verdict %d, want the reply redirected back to the pod", ret)
	}
	arp := out[14:]
	if op := binary.BigEndian.Uint16(arp[6:8]); op != 2 {
		t.Fatalf("ARP op %d, want reply", op)
	}
	if !bytes.Equal(arp[8:14], hostMAC) || !bytes.Equal(out[0:6], podMAC) || !bytes.Equal(out[6:12], hostMAC) {
		t.Fatalf("reply does not carry the gateway MAC %v to %v: % x", hostMAC, podMAC, out[:42])
	}
	if sip := netip.AddrFrom4([4]byte(arp[14:18])); sip != gateway {
		t.Fatalf("reply sender IP %v, want %v", sip, gateway)
	}
	if tip := netip.AddrFrom4([4]byte(arp[24:28])); tip != podA {
		t.Fatalf("reply target IP %v, want %v", tip, podA)
	}
	// Gratuitous ARP and requests from addresses the pod does not own get no answer.
	if ret, _ := run(t, p.FromContainer, arpRequest(podMAC, podA, podA), ifA); ret != tcActShot {
		t.Fatalf("gratuitous ARP verdict %d, want drop", ret)
	}
	if ret, _ := run(t, p.FromContainer, arpRequest(podMAC, podB, gateway), ifA); ret != tcActShot {
		t.Fatalf("spoofed ARP verdict %d, want drop", ret)
	}
}

func TestFromOverlayDeliversOrAcceptsForHost(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	ret, out := run(t, p.FromOverlay, udpFrame(peerHW, peerHW, remote, podA, nil), 99)
	if ret != tcActRedirect || !bytes.Equal(out[0:6], podMAC) {
		t.Fatalf("verdict %d dst %v, want redirect to pod A", ret, net.HardwareAddr(out[0:6]))
	}
	if ret, _ := run(t, p.FromOverlay, udpFrame(peerHW, peerHW, remote, netip.MustParseAddr("10.99.0.11"), nil), 99); ret != tcActOK {
		t.Fatalf("verdict %d for the node's own address, want pass", ret)
	}
}

func TestFromNetdevDeliversLocalPods(t *testing.T) {
	p := loadTest(t, ModeNative)
	if ret, _ := run(t, p.FromNetdev, udpFrame(hostMAC, peerHW, remote, podB, nil), 3); ret != tcActRedirect {
		t.Fatalf("verdict %d, want redirect to pod B", ret)
	}
	if ret, _ := run(t, p.FromNetdev, udpFrame(hostMAC, peerHW, remote, outside, nil), 3); ret != tcActOK {
		t.Fatalf("verdict %d for a non-pod address, want pass", ret)
	}
}

func TestMapsAreFamilyTagged(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	tm := tunnelMap{p.Tunnels}
	v6 := netip.MustParsePrefix("fd00:10:244:2::/64")
	if err := tm.put(v6, netip.MustParseAddr("fd00::12")); err != nil {
		t.Fatal(err)
	}
	got, err := tm.list()
	if err != nil {
		t.Fatal(err)
	}
	if got[v6] != netip.MustParseAddr("fd00::12") || got[netip.MustParsePrefix("10.244.2.0/24")] != netip.MustParseAddr("10.99.0.12") {
		t.Fatalf("tunnel map round trip: %v", got)
	}
	// An IPv4 packet must never match an IPv6 prefix of the same bits.
	if ret, _ := run(t, p.FromContainer, udpFrame(hostMAC, podMAC, podA, netip.MustParseAddr("253.0.0.16"), nil), ifA); ret != tcActOK {
		t.Fatalf("IPv4 address matched an IPv6 prefix: verdict %d", ret)
	}
}

package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/weirnet/weir/internal/service"
)

var nodeAddr = netip.MustParseAddr("10.99.0.11")

// runCtx runs prog on frame and returns the verdict, the frame and the
// skb context (its mark) after it.
func runCtx(t *testing.T, prog *ebpf.Program, frame []byte, ingress uint32) (uint32, []byte, skbCtx) {
	t.Helper()
	out := make([]byte, len(frame)+256)
	// The kernel writes its whole __sk_buff back: room past skbCtx.
	var ctxOut struct {
		Skb  skbCtx
		Rest [256]byte
	}
	opts := &ebpf.RunOptions{Data: frame, DataOut: out, Context: skbCtx{IngressIfindex: ingress}, ContextOut: &ctxOut}
	ret, err := prog.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_RUN: %v", err)
	}
	return ret, opts.DataOut, ctxOut.Skb
}

// tcpHeaders reads the addresses and ports of a TCP frame and checks both
// of its checksums.
func tcpHeaders(t *testing.T, frame []byte) (src, dst netip.AddrPort) {
	t.Helper()
	ip := frame[14:34]
	if ipChecksum(ip) != 0 {
		t.Errorf("IPv4 header checksum wrong after the rewrite")
	}
	s, d := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	seg := frame[34 : 14+int(binary.BigEndian.Uint16(ip[2:4]))]
	if l4Checksum(s, d, 6, seg) != 0 {
		t.Errorf("TCP checksum wrong after the rewrite")
	}
	return netip.AddrPortFrom(s, binary.BigEndian.Uint16(seg[0:2])), netip.AddrPortFrom(d, binary.BigEndian.Uint16(seg[2:4]))
}

// nodePortTable has external NodePort entries at nodeAddr: 30080 with a
// local backend, 30081 with one on another node, 30082 dropping, 30083
// without backends, and 30084 for sockets only.
func nodePortTable() service.Table {
	return service.Table{
		ext(30080): {Backends: []service.Backend{{Addr: podA, Port: 8080}}},
		ext(30081): {Backends: []service.Backend{{Addr: remote, Port: 8080}}},
		ext(30082): {DropWhenEmpty: true},
		ext(30083): {},
	}
}

// TestNodePortOffBesideKubeProxy: loaded for a node beside kube-proxy,
// from_netdev leaves even a NodePort with external entries to the stack.
func TestNodePortOffBesideKubeProxy(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	if err := (&Node{progs: p}).SetServices(nodePortTable()); err != nil {
		t.Fatal(err)
	}
	ret, out, _ := runCtx(t, p.FromNetdev, tcpFrame(hostMAC, peerHW, outside, nodeAddr, 40001, 30080, 1, tcpSYN, nil), 3)
	if _, dst := tcpHeaders(t, out); ret != tcActOK || dst != netip.AddrPortFrom(nodeAddr, 30080) {
		t.Errorf("beside kube-proxy: %s to %v, want ok and untranslated", tcVerdictName(ret), dst)
	}
}

// TestNodePortFromOutside runs packets from outside the cluster through
// from_netdev and their replies through to_netdev: a NodePort with a
// local backend is rewritten to it with valid checksums, the client's
// address kept and no mark; one whose backend is on another node is
// marked for the stack to give it the node's address; later packets of a
// flow keep its backend; the reply leaves with the NodePort as its
// source; an externalTrafficPolicy: Local NodePort without a local
// endpoint drops; one without any endpoint is left to the stack to
// refuse; a socket-scope entry does not serve packets from outside.
func TestNodePortFromOutside(t *testing.T) {
	p := loadTestWith(t, ModeVXLAN, func(c *ProgramConfig) { c.ExternalServices = true })
	n := &Node{progs: p}
	if err := n.SetServices(nodePortTable()); err != nil {
		t.Fatal(err)
	}
	syn := func(dport uint16) []byte {
		return tcpFrame(hostMAC, peerHW, outside, nodeAddr, 40001, dport, 1, tcpSYN, nil)
	}

	ret, out, ctx := runCtx(t, p.FromNetdev, syn(30080), 3)
	if ret != tcActOK {
		t.Fatalf("NodePort with a local backend: verdict %s, want ok (to the stack)", tcVerdictName(ret))
	}
	if src, dst := tcpHeaders(t, out); src != netip.AddrPortFrom(outside, 40001) || dst != netip.AddrPortFrom(podA, 8080) {
		t.Errorf("translated %v -> %v, want %v:40001 -> %v:8080", src, dst, outside, podA)
	}
	if ctx.Mark&nodePortSNATMark != 0 {
		t.Errorf("a local backend's packet is marked for SNAT (mark %#x): the client's address must stay", ctx.Mark)
	}
	// The ACK of the same flow keeps its backend.
	ack := tcpFrame(hostMAC, peerHW, outside, nodeAddr, 40001, 30080, 2, tcpACK, []byte("GET /"))
	if _, out, _ := runCtx(t, p.FromNetdev, ack, 3); func() bool { _, d := tcpHeaders(t, out); return d != netip.AddrPortFrom(podA, 8080) }() {
		t.Errorf("a later packet of the flow was not sent to its backend")
	}
	// The backend's reply leaves with the NodePort as its source.
	reply := tcpFrame(peerHW, hostMAC, podA, outside, 8080, 40001, 7, tcpSYN|tcpACK, nil)
	ret, out, _ = runCtx(t, p.ToNetdev, reply, 0)
	if src, dst := tcpHeaders(t, out); ret != tcActOK || src != netip.AddrPortFrom(nodeAddr, 30080) || dst != netip.AddrPortFrom(outside, 40001) {
		t.Errorf("reply %s %v -> %v, want ok %v:30080 -> %v:40001", tcVerdictName(ret), src, dst, nodeAddr, outside)
	}
	// A packet to the backend the node sends on its own is not touched.
	other := tcpFrame(peerHW, hostMAC, podA, outside, 8080, 40002, 7, tcpACK, nil)
	if _, out, _ := runCtx(t, p.ToNetdev, other, 0); func() bool { s, _ := tcpHeaders(t, out); return s != netip.AddrPortFrom(podA, 8080) }() {
		t.Errorf("a reply of no translated flow was rewritten")
	}

	ret, out, ctx = runCtx(t, p.FromNetdev, syn(30081), 3)
	if _, dst := tcpHeaders(t, out); ret != tcActOK || dst != netip.AddrPortFrom(remote, 8080) {
		t.Errorf("NodePort with a remote backend: %s to %v, want ok to %v:8080", tcVerdictName(ret), dst, remote)
	}
	if ctx.Mark&nodePortSNATMark != nodePortSNATMark {
		t.Errorf("a remote backend's packet has mark %#x, want %#x for the node's SNAT", ctx.Mark, nodePortSNATMark)
	}

	drops := metric(t, p, "drop_nodeport")
	if ret, _, _ := runCtx(t, p.FromNetdev, syn(30082), 3); ret != tcActShot {
		t.Errorf("externalTrafficPolicy: Local without a local endpoint: %s, want drop", tcVerdictName(ret))
	}
	if got := metric(t, p, "drop_nodeport") - drops; got != 1 {
		t.Errorf("drop_nodeport rose by %d, want 1", got)
	}
	for _, port := range []uint16{30083, 30084} {
		ret, out, _ := runCtx(t, p.FromNetdev, syn(port), 3)
		if _, dst := tcpHeaders(t, out); ret != tcActOK || dst != netip.AddrPortFrom(nodeAddr, port) {
			t.Errorf("port %d: %s to %v, want ok and untranslated (the stack answers)", port, tcVerdictName(ret), dst)
		}
	}
	if got, want := metric(t, p, "nodeport_new"), uint64(2); got != want {
		t.Errorf("nodeport_new = %d, want %d", got, want)
	}

	// A stray segment of no flow opens none: the stack answers it.
	stray := tcpFrame(hostMAC, peerHW, outside, nodeAddr, 40009, 30080, 5, tcpACK, nil)
	if _, out, _ := runCtx(t, p.FromNetdev, stray, 3); func() bool { _, d := tcpHeaders(t, out); return d != netip.AddrPortFrom(nodeAddr, 30080) }() {
		t.Errorf("an ACK of no flow was translated")
	}
	// The flow's backend is taken away: its translation goes both ways,
	// so its next segment is the stack's to answer (a reset), and no
	// reply of the old backend leaves as the NodePort.
	f := ext(30080)
	if err := n.CloseServiceSockets(map[service.Frontend][]service.Backend{f: {{Addr: podA, Port: 8080}}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, out, _ := runCtx(t, p.FromNetdev, ack, 3); func() bool { _, d := tcpHeaders(t, out); return d != netip.AddrPortFrom(nodeAddr, 30080) }() {
		t.Errorf("a flow whose backend went is still translated")
	}
	if _, out, _ := runCtx(t, p.ToNetdev, reply, 0); func() bool { s, _ := tcpHeaders(t, out); return s != netip.AddrPortFrom(podA, 8080) }() {
		t.Errorf("a reply of a flow whose backend went still leaves as the NodePort")
	}
}

func ext(port uint16) service.Frontend {
	return service.Frontend{Addr: nodeAddr, Port: port, Proto: service.ProtoTCP, External: true}
}

// TestNodePortMaglevMovesFewFlows measures what taking one of ten
// backends away does to 400 flows from outside: the flows on it move, and
// of the others no more than 2% (Maglev consistent hashing), where random
// picking would move nine in ten of them.
func TestNodePortMaglevMovesFewFlows(t *testing.T) {
	p := loadTestWith(t, ModeVXLAN, func(c *ProgramConfig) { c.ExternalServices = true })
	n := &Node{progs: p}
	var backends []service.Backend
	for i := range 10 {
		backends = append(backends, service.Backend{Addr: netip.AddrFrom4([4]byte{10, 244, 2, byte(10 + i)}), Port: 8080})
	}
	fe := service.Frontend{Addr: nodeAddr, Port: 30090, Proto: service.ProtoTCP, External: true}
	flows := func() []netip.AddrPort {
		out := make([]netip.AddrPort, 400)
		for i := range out {
			// A new SYN of a tuple picks afresh, as a new connection does.
			frame := tcpFrame(hostMAC, peerHW, outside, nodeAddr, uint16(20000+i), 30090, 1, tcpSYN, nil)
			ret, b, _ := runCtx(t, p.FromNetdev, frame, 3)
			if ret != tcActOK {
				t.Fatalf("flow %d: verdict %s", i, tcVerdictName(ret))
			}
			_, out[i] = tcpHeaders(t, b)
		}
		return out
	}
	if err := n.SetServices(service.Table{fe: {Backends: backends}}); err != nil {
		t.Fatal(err)
	}
	before := flows()
	used := map[netip.AddrPort]int{}
	for _, b := range before {
		used[b]++
	}
	if len(used) != len(backends) {
		t.Errorf("400 flows used %d of %d backends: %v", len(used), len(backends), used)
	}
	gone := netip.AddrPortFrom(backends[4].Addr, backends[4].Port)
	if err := n.SetServices(service.Table{fe: {Backends: append(append([]service.Backend{}, backends[:4]...), backends[5:]...)}}); err != nil {
		t.Fatal(err)
	}
	after := flows()
	movedOthers := 0
	for i := range before {
		switch {
		case after[i] == gone:
			t.Errorf("flow %d still goes to the removed backend", i)
		case before[i] != gone && after[i] != before[i]:
			movedOthers++
		}
	}
	others := len(before) - used[gone]
	t.Logf("removing 1 of 10 backends: its %d flows moved, and %d of the other %d", used[gone], movedOthers, others)
	if movedOthers > others/50 {
		t.Errorf("%d of %d flows not on the removed backend moved, want at most 2%%", movedOthers, others)
	}
}

// TestNodePortFromPeerPod: a peer's pod is never translated here (its own
// node's sockets send it to a backend, and replies would not come back
// through this node), but its packet to an externalTrafficPolicy: Local
// NodePort without an endpoint here, which its node leaves to this one, is
// dropped as a client's from outside would be.
func TestNodePortFromPeerPod(t *testing.T) {
	p := loadTestWith(t, ModeVXLAN, func(c *ProgramConfig) { c.ExternalServices = true })
	if err := (&Node{progs: p}).SetServices(nodePortTable()); err != nil {
		t.Fatal(err)
	}
	ret, out, _ := runCtx(t, p.FromNetdev, tcpFrame(hostMAC, peerHW, remote, nodeAddr, 40001, 30080, 1, tcpSYN, nil), 3)
	if _, dst := tcpHeaders(t, out); ret != tcActOK || dst != netip.AddrPortFrom(nodeAddr, 30080) {
		t.Errorf("a peer's pod to a NodePort with a backend: %s to %v, want ok and untranslated", tcVerdictName(ret), dst)
	}
	if ret, _, _ := runCtx(t, p.FromNetdev, tcpFrame(hostMAC, peerHW, remote, nodeAddr, 40002, 30082, 1, tcpSYN, nil), 3); ret != tcActShot {
		t.Errorf("a peer's pod to a Local NodePort without an endpoint here: %s, want dropped", tcVerdictName(ret))
	}
}

// TestNodePortHashSeeded: two nodes loaded with the cluster's seed send
// 200 flows from outside to the same backends (every node picks alike),
// and a node of another seed sends most of them elsewhere: the picks
// cannot be computed without the seed.
func TestNodePortHashSeeded(t *testing.T) {
	var backends []service.Backend
	for i := range 10 {
		backends = append(backends, service.Backend{Addr: netip.AddrFrom4([4]byte{10, 244, 2, byte(10 + i)}), Port: 8080})
	}
	fe := service.Frontend{Addr: nodeAddr, Port: 30090, Proto: service.ProtoTCP, External: true}
	picks := func(seed uint64) []netip.AddrPort {
		p := loadTestWith(t, ModeVXLAN, func(c *ProgramConfig) { c.ExternalServices, c.HashSeed = true, seed })
		if err := (&Node{progs: p}).SetServices(service.Table{fe: {Backends: backends}}); err != nil {
			t.Fatal(err)
		}
		out := make([]netip.AddrPort, 200)
		for i := range out {
			_, b, _ := runCtx(t, p.FromNetdev, tcpFrame(hostMAC, peerHW, outside, nodeAddr, uint16(20000+i), 30090, 1, tcpSYN, nil), 3)
			_, out[i] = tcpHeaders(t, b)
		}
		return out
	}
	a, b, other := picks(0x5eed5eed12345678), picks(0x5eed5eed12345678), picks(0x0123456789abcdef)
	same := 0
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("flow %d: two nodes of one seed picked %v and %v", i, a[i], b[i])
		}
		if a[i] == other[i] {
			same++
		}
	}
	// Independent picks among 10 backends agree about one time in ten.
	if same > 50 {
		t.Errorf("another seed picked the same backend for %d of 200 flows, want about 20", same)
	}
}

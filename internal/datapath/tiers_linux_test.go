package datapath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/weirnet/weir/internal/policy"
)

// clusterPolicy is a cluster policy of kind whose subject is the pods
// with app=subject in any namespace.
func clusterPolicy(kind, name string, tier npav1alpha2.Tier, priority int32, subject string) *policy.ClusterPolicy {
	p := &policy.ClusterPolicy{Kind: kind, Name: name}
	p.Spec.Tier, p.Spec.Priority = tier, priority
	p.Spec.Subject.Pods = &npav1alpha2.NamespacedPod{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": subject}}}
	return p
}

func fromApp(app string) npav1alpha2.ClusterNetworkPolicyIngressPeer {
	return npav1alpha2.ClusterNetworkPolicyIngressPeer{Pods: &npav1alpha2.NamespacedPod{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}}
}

func tcpPort(n int32) npav1alpha2.ClusterNetworkPolicyProtocol {
	return npav1alpha2.ClusterNetworkPolicyProtocol{TCP: &npav1alpha2.ClusterNetworkPolicyProtocolTCP{
		DestinationPort: &npav1alpha2.Port{Number: n}}}
}

func udpPort(n int32) npav1alpha2.ClusterNetworkPolicyProtocol {
	return npav1alpha2.ClusterNetworkPolicyProtocol{UDP: &npav1alpha2.ClusterNetworkPolicyProtocolUDP{
		DestinationPort: &npav1alpha2.Port{Number: n}}}
}

// rejectB is a Weir policy that rejects what app=a sends app=b on TCP 80
// and UDP 7777.
func rejectB() *policy.ClusterPolicy {
	p := clusterPolicy(policy.KindWeirClusterNetworkPolicy, "guard", npav1alpha2.AdminTier, 1, "b")
	p.Spec.Ingress = []npav1alpha2.ClusterNetworkPolicyIngressRule{{
		Name: "no-a", Action: "Reject", From: []npav1alpha2.ClusterNetworkPolicyIngressPeer{fromApp("a")},
		Protocols: []npav1alpha2.ClusterNetworkPolicyProtocol{tcpPort(80), udpPort(7777)},
	}}
	return p
}

func loadCluster(t *testing.T, n *Node, cps ...*policy.ClusterPolicy) *policy.Result {
	t.Helper()
	s := policyFixture()
	s.ClusterPolicies = cps
	return loadPolicy(t, n, policy.NewCompiler(), nil, s)
}

// TestRejectAnswersTCPWithReset: a SYN a Reject rule denies comes back to
// the sender as a reset with valid checksums, and the verdict event names
// the rule.
func TestRejectAnswersTCPWithReset(t *testing.T) {
	p, n, rd := eventNode(t)
	res := loadCluster(t, n, rejectB())
	want := res.Lookup("x/b", policy.Ingress, podA, 6, 80)
	if want.Verdict != policy.VerdictReject {
		t.Fatalf("compiler: %+v, want a reject", want)
	}

	syn := tcpFrame(hostMAC, podMAC, podA, podB, 40001, 80, 1000, tcpSYN, nil)
	ret, out := run(t, p.FromContainer, syn, ifA)
	if ret != tcActRedirect {
		t.Fatalf("rejected SYN: verdict %d, want the answer redirected to A", ret)
	}
	rst := checkReset(t, out)
	if got := binary.BigEndian.Uint32(rst[8:12]); rst[13] != tcpRST|tcpACK || got != 1001 {
		t.Fatalf("reset to a SYN: flags %#x ack %d, want RST|ACK acking 1001", rst[13], got)
	}
	if ev := readEvent(t, rd); ev.Direction != policy.Egress || ev.Verdict != policy.VerdictAllow {
		t.Fatalf("first event %+v, want A's egress allowed", ev)
	}
	ev := readEvent(t, rd)
	if ev.Verdict != policy.VerdictReject || ev.Stage != policy.StageAdmin || ev.Rule != want.Rule || ev.Ifindex != ifB {
		t.Fatalf("reject event %+v, want rejected at admin by rule %d", ev, want.Rule)
	}

	// A segment with ACK set, of a connection the Reject rule revokes,
	// is answered with its own ack number as seq. (With no connection it
	// would be dropped: only a SYN begins a flow.)
	c := policy.NewCompiler()
	open := loadPolicy(t, n, c, nil, policyFixture())
	if ret, _ := run(t, p.FromContainer, tcpFrame(hostMAC, podMAC, podA, podB, 40002, 80, 4999, tcpSYN, nil), ifA); ret != tcActRedirect {
		t.Fatalf("SYN before the reject rule: verdict %d, want redirect", ret)
	}
	withReject := policyFixture()
	withReject.ClusterPolicies = []*policy.ClusterPolicy{rejectB()}
	loadPolicy(t, n, c, open, withReject)
	ack := tcpFrame(hostMAC, podMAC, podA, podB, 40002, 80, 5000, tcpACK, []byte("data"))
	binary.BigEndian.PutUint32(ack[14+20+8:], 7000)
	binary.BigEndian.PutUint16(ack[14+20+16:], 0)
	binary.BigEndian.PutUint16(ack[14+20+16:], l4Checksum(podA, podB, 6, ack[14+20:]))
	if ret, out = run(t, p.FromContainer, ack, ifA); ret != tcActRedirect {
		t.Fatalf("rejected ACK segment: verdict %d, want redirect", ret)
	}
	rst = checkReset(t, out)
	if got := binary.BigEndian.Uint32(rst[4:8]); rst[13] != tcpRST || got != 7000 {
		t.Fatalf("reset to an ACK: flags %#x seq %d, want RST with seq 7000", rst[13], got)
	}
	// A reset is never answered.
	reset := tcpFrame(hostMAC, podMAC, podA, podB, 40003, 80, 1, tcpRST, nil)
	if ret, _ = run(t, p.FromContainer, reset, ifA); ret != tcActShot {
		t.Fatalf("rejected RST: verdict %d, want a silent drop", ret)
	}
	if got := metric(t, p, "policy_reject"); got != 2 {
		t.Fatalf("policy_reject = %d, want 2", got)
	}
}

// checkReset checks the frame is a 40-byte TCP reset from B to A, both
// checksums valid, and returns its TCP header.
func checkReset(t *testing.T, out []byte) []byte {
	t.Helper()
	if len(out) != 14+40 {
		t.Fatalf("answer is %d bytes, want %d", len(out), 14+40)
	}
	if !bytes.Equal(out[0:6], podMAC) || !bytes.Equal(out[6:12], hostMAC) {
		t.Fatalf("answer MACs dst %x src %x, want %x %x", out[0:6], out[6:12], podMAC, hostMAC)
	}
	ip, tcp := out[14:34], out[34:54]
	if ipChecksum(ip) != 0 || netip.AddrFrom4([4]byte(ip[12:16])) != podB || netip.AddrFrom4([4]byte(ip[16:20])) != podA || ip[9] != 6 {
		t.Fatalf("answer IP header %x: want B to A, TCP, valid checksum", ip)
	}
	if l4Checksum(podB, podA, 6, tcp) != 0 {
		t.Fatalf("answer TCP checksum invalid: %x", tcp)
	}
	if binary.BigEndian.Uint16(tcp[0:2]) != 80 {
		t.Fatalf("answer from port %d, want 80", binary.BigEndian.Uint16(tcp[0:2]))
	}
	return tcp
}

// TestRejectAnswersUDPWithICMP: a UDP datagram is answered with ICMP
// "administratively prohibited" quoting its headers.
func TestRejectAnswersUDPWithICMP(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	n := &Node{progs: p}
	loadCluster(t, n, rejectB())
	frame := udpFrameTo(podA, podB, 7777)
	ret, out := run(t, p.FromContainer, frame, ifA)
	if ret != tcActRedirect {
		t.Fatalf("rejected datagram: verdict %d, want the answer redirected to A", ret)
	}
	if len(out) != 14+20+8+28 {
		t.Fatalf("answer is %d bytes, want %d", len(out), 14+20+8+28)
	}
	ip, icmp := out[14:34], out[34:]
	if ipChecksum(ip) != 0 || ip[9] != 1 || netip.AddrFrom4([4]byte(ip[12:16])) != podB || netip.AddrFrom4([4]byte(ip[16:20])) != podA {
		t.Fatalf("answer IP header %x: want ICMP from B to A, valid checksum", ip)
	}
	if icmp[0] != 3 || icmp[1] != 13 || ipChecksum(icmp) != 0 {
		t.Fatalf("answer ICMP %x: want type 3 code 13 with a valid checksum", icmp[:8])
	}
	if !bytes.Equal(icmp[8:], frame[14:14+28]) {
		t.Fatalf("ICMP quote %x, want the datagram's headers %x", icmp[8:], frame[14:14+28])
	}
}

// TestRejectAnswersRemoteSenderThroughOverlay: a rejected packet from a
// remote pod is answered back through the tunnel.
func TestRejectAnswersRemoteSenderThroughOverlay(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	n := &Node{progs: p}
	s := policyFixture()
	s.ClusterPolicies = []*policy.ClusterPolicy{rejectB()}
	loadPolicy(t, n, policy.NewCompiler(), nil, s)
	before := metric(t, p, "redirect_tunnel")
	syn := tcpFrame(peerHW, hostMAC, remote, podB, 40001, 80, 9, tcpSYN, nil)
	if ret, _ := run(t, p.FromOverlay, syn, 99); ret != tcActRedirect {
		t.Fatalf("rejected SYN from a remote pod: verdict %d, want redirect to the overlay", ret)
	}
	if got := metric(t, p, "redirect_tunnel") - before; got != 1 {
		t.Fatalf("redirect_tunnel grew by %d, want 1", got)
	}
}

// TestTieredPolicyDatapathAgreesWithCompiler loads random cluster
// policies (both kinds, both tiers, every action) with and without a
// NetworkPolicy, sends new flows from A to B, and holds the datapath's
// verdict, answer and event (stage, deciding, Log and Pass rules) to the
// compiled result's own decision; `weir policy trace`'s BPF_PROG_RUN of
// the same flow must give the same events.
func TestTieredPolicyDatapathAgreesWithCompiler(t *testing.T) {
	_, n, rd := eventNode(t)
	c := policy.NewCompiler()
	var prev *policy.Result
	sport, checked := uint16(20000), 0
	for seed := uint64(0); seed < 40; seed++ {
		r := rand.New(rand.NewPCG(seed, 3))
		s := policyFixture()
		if r.IntN(3) == 0 {
			s.Policies = append(s.Policies, ingressFromApp("a", "UDP", 7777))
		}
		for i := 1 + r.IntN(3); i > 0; i-- {
			s.ClusterPolicies = append(s.ClusterPolicies, randomClusterPolicy(r, fmt.Sprintf("c%d", i)))
		}
		prev = loadPolicy(t, n, c, prev, s)
		for _, proto := range []uint8{6, 17} {
			for _, port := range []uint16{80, 7000, 7050, 7777, 9000} {
				sport++
				frame := udpFrameTo(podA, podB, port)
				binary.BigEndian.PutUint16(frame[14+20:], sport)
				if proto == 6 {
					frame = tcpFrame(hostMAC, podMAC, podA, podB, sport, port, 1, tcpSYN, nil)
				}
				if err := checkFlow(t, n, rd, prev, frame, proto, port); err != nil {
					t.Fatalf("seed %d %s/%d: %v", seed, policy.ProtoName(proto), port, err)
				}
				checked++
			}
		}
	}
	t.Logf("%d flows: datapath verdicts and events agree with the compiler", checked)
}

// checkFlow runs one new flow A->B and compares it with the compiler.
func checkFlow(t *testing.T, n *Node, rd *EventReader, res *policy.Result, frame []byte, proto uint8, port uint16) error {
	p := n.progs
	egress := res.Lookup("x/a", policy.Egress, podB, proto, port)
	ingress := res.Lookup("x/b", policy.Ingress, podA, proto, port)
	decisive := ingress
	if !egress.Allowed() {
		decisive = egress
	}
	want := uint32(tcActRedirect) // delivered to B, or the answer to A
	if decisive.Verdict == policy.VerdictDeny {
		want = tcActShot
	}
	if ret, _ := run(t, p.FromContainer, frame, ifA); ret != want {
		return fmt.Errorf("datapath verdict %d, want %d (egress %+v, ingress %+v)", ret, want, egress, ingress)
	}
	wantEvents := []policy.Decision{egress}
	if egress.Allowed() {
		wantEvents = append(wantEvents, ingress)
	}
	live := make([]VerdictEvent, len(wantEvents))
	for i := range wantEvents {
		live[i] = readEvent(t, rd)
	}
	// The same flow through Trace: the private copy of the programs must
	// decide what the live ones did.
	tr, err := n.Trace(TracePacket{Src: podA, Dst: podB, Proto: proto, Port: port, SrcIfindex: ifA, DstIfindex: ifB})
	if err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	if len(tr.Events) != len(wantEvents) {
		return fmt.Errorf("trace saw %d events, the live datapath %d", len(tr.Events), len(wantEvents))
	}
	for i, d := range wantEvents {
		for _, ev := range []VerdictEvent{live[i], tr.Events[i]} {
			if ev.Verdict != d.Verdict || ev.Stage != d.Stage || ev.Rule != d.Rule || ev.Log != d.Log || ev.Passed != d.Passed {
				return fmt.Errorf("event %s verdict %s stage %s rule %d log %d passed %d, compiler %+v",
					ev.Direction, ev.Verdict, ev.Stage, ev.Rule, ev.Log, ev.Passed, d)
			}
		}
	}
	return nil
}

func randomClusterPolicy(r *rand.Rand, name string) *policy.ClusterPolicy {
	kinds := []string{policy.KindClusterNetworkPolicy, policy.KindWeirClusterNetworkPolicy}
	tiers := []npav1alpha2.Tier{npav1alpha2.AdminTier, npav1alpha2.BaselineTier}
	apps := []string{"a", "b"}
	cp := clusterPolicy(kinds[r.IntN(2)], name, tiers[r.IntN(2)], int32(r.IntN(3)), apps[r.IntN(2)])
	actions := []string{"Accept", "Deny", "Pass"}
	if cp.Kind == policy.KindWeirClusterNetworkPolicy {
		actions = append(actions, "Reject", "Log")
	}
	protos := func() []npav1alpha2.ClusterNetworkPolicyProtocol {
		switch r.IntN(4) {
		case 0:
			return nil
		case 1:
			return []npav1alpha2.ClusterNetworkPolicyProtocol{udpPort(7777)}
		case 2:
			return []npav1alpha2.ClusterNetworkPolicyProtocol{{UDP: &npav1alpha2.ClusterNetworkPolicyProtocolUDP{
				DestinationPort: &npav1alpha2.Port{Range: &npav1alpha2.PortRange{Start: 7000, End: 7063}}}}}
		}
		return []npav1alpha2.ClusterNetworkPolicyProtocol{tcpPort(80)}
	}
	for i := 1 + r.IntN(3); i > 0; i-- {
		cp.Spec.Ingress = append(cp.Spec.Ingress, npav1alpha2.ClusterNetworkPolicyIngressRule{
			Action: npav1alpha2.ClusterNetworkPolicyRuleAction(actions[r.IntN(len(actions))]),
			From:   []npav1alpha2.ClusterNetworkPolicyIngressPeer{fromApp(apps[r.IntN(2)])}, Protocols: protos()})
	}
	for i := r.IntN(3); i > 0; i-- {
		peer := npav1alpha2.ClusterNetworkPolicyEgressPeer{Networks: []npav1alpha2.CIDR{
			[]npav1alpha2.CIDR{"10.244.1.0/24", "10.244.1.3/32", "0.0.0.0/0", "10.244.2.0/24"}[r.IntN(4)]}}
		if r.IntN(2) == 0 {
			peer = npav1alpha2.ClusterNetworkPolicyEgressPeer{Pods: fromApp(apps[r.IntN(2)]).Pods}
		}
		cp.Spec.Egress = append(cp.Spec.Egress, npav1alpha2.ClusterNetworkPolicyEgressRule{
			Action: npav1alpha2.ClusterNetworkPolicyRuleAction(actions[r.IntN(len(actions))]),
			To:     []npav1alpha2.ClusterNetworkPolicyEgressPeer{peer}, Protocols: protos()})
	}
	return cp
}

// TestFlowEventsSwitch: with the events switched off a new flow is still
// judged, and counted for the metrics, but leaves no event; switched on
// again, the next one does. Pruned, the counters go.
func TestFlowEventsSwitch(t *testing.T) {
	p, n, rd := eventNode(t)
	res := loadCluster(t, n, rejectB())
	if err := SetPinnedFlowEvents(p.cfg.PinDir, false); err != nil {
		t.Fatal(err)
	}
	if ret, _ := run(t, p.FromContainer, tcpFrame(hostMAC, podMAC, podA, podB, 40001, 80, 1, tcpSYN, nil), ifA); ret != tcActRedirect {
		t.Fatalf("rejected SYN with events off: verdict %d, want the answer", ret)
	}
	reject := res.Lookup("x/b", policy.Ingress, podA, 6, 80)
	counts, err := n.VerdictCounts()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range counts {
		if c.Verdict == policy.VerdictReject {
			found = c.Rule == reject.Rule && c.Direction == policy.Ingress && c.Stage == policy.StageAdmin && c.Count == 1 && c.Ifindex == 0
		}
	}
	if !found {
		t.Fatalf("verdict counters %+v, want the reject by rule %d counted once with events off", counts, reject.Rule)
	}
	if err := n.SetFlowEvents(true); err != nil {
		t.Fatal(err)
	}
	if ret, _ := run(t, p.FromContainer, udpFrameTo(podA, podB, 9999), ifA); ret != tcActRedirect {
		t.Fatalf("allowed datagram: verdict %d, want delivery", ret)
	}
	if ev := readEvent(t, rd); ev.Dst.Port() != 9999 {
		t.Fatalf("first event after switching on is for port %d: the flow sent with events off left one", ev.Dst.Port())
	}
	if err := n.PruneVerdictCounts(func(VerdictCount) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if counts, err := n.VerdictCounts(); err != nil || len(counts) != 0 {
		t.Fatalf("after pruning all: %+v (%v)", counts, err)
	}
}

package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirnet/weir/internal/policy"
)

// udpFlow is a UDP frame from src:sport to dst:dport.
func udpFlow(src, dst netip.Addr, sport, dport uint16) []byte {
	f := udpFrameTo(src, dst, dport)
	binary.BigEndian.PutUint16(f[14+20:], sport)
	return f
}

// TestTCPFlowBeginsOnlyWithSYN: a TCP packet that matches no tracked
// flow and is no SYN opens nothing, whatever policy allows.
func TestTCPFlowBeginsOnlyWithSYN(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	for _, c := range []struct {
		name  string
		flags uint8
	}{{"ACK", tcpACK}, {"SYN-ACK", tcpSYN | tcpACK}, {"RST", tcpRST}, {"FIN", tcpFIN | tcpACK}} {
		f := tcpFrame(hostMAC, podMAC, podA, podB, 40100, 80, 1, c.flags, nil)
		if ret, _ := run(t, p.FromContainer, f, ifA); ret != tcActShot {
			t.Errorf("%s of no flow: verdict %d, want drop", c.name, ret)
		}
	}
	if got := metric(t, p, "drop_no_flow"); got != 4 {
		t.Errorf("drop_no_flow = %d, want 4", got)
	}
	syn := tcpFrame(hostMAC, podMAC, podA, podB, 40100, 80, 1, tcpSYN, nil)
	if ret, _ := run(t, p.FromContainer, syn, ifA); ret != tcActRedirect {
		t.Fatalf("SYN: verdict %d, want redirect", ret)
	}
	synAck := tcpFrame(hostMAC, podMAC, podB, podA, 80, 40100, 1, tcpSYN|tcpACK, nil)
	if ret, _ := run(t, p.FromContainer, synAck, ifB); ret != tcActRedirect {
		t.Fatalf("SYN-ACK of the tracked flow: verdict %d, want redirect", ret)
	}
}

// TestRevocationSurvivesConntrackChurn: after a flow is revoked, a pod
// churns the whole conntrack table with new flows until the revoked
// entry is evicted; neither end's next packet may reopen the flow, and a
// grant reopens it.
func TestRevocationSurvivesConntrackChurn(t *testing.T) {
	p, n, _ := eventNode(t)
	c := policy.NewCompiler()
	granted := loadPolicy(t, n, c, nil, policyFixture(ingressFromApp("a", "UDP", 7777)))
	flow := udpFlow(podA, podB, 40000, 7777)
	reply := udpFlow(podB, podA, 7777, 40000)
	if ret, _ := run(t, p.FromContainer, flow, ifA); ret != tcActRedirect {
		t.Fatalf("granted flow: verdict %d, want redirect", ret)
	}
	revoked := loadPolicy(t, n, c, granted, policyFixture(ingressFromApp("nothing", "UDP", 7777)))
	if ret, _ := run(t, p.FromContainer, flow, ifA); ret != tcActShot {
		t.Fatalf("revoked flow: verdict %d, want drop", ret)
	}

	// Churn: twice the table's size in new flows from B (whose egress and
	// the world's ingress are open), each sent twice: the kernel's LRU
	// spares entries that were looked up again while fresh ones are
	// plentiful, and the revoked entry was.
	key := lxcCtKey{Saddr: addr4(podA), Daddr: addr4(podB), Sport: be16(40000), Dport: be16(7777), Proto: 17}
	churn := udpFlow(podB, outside, 1, 9)
	for i := 0; i < int(2*p.CTAny.MaxEntries()); i++ {
		binary.BigEndian.PutUint16(churn[14+20:], uint16(i)) // source port
		churn[14+19] = byte(i >> 16)                         // destination 192.0.2.x
		for range 2 {
			if ret, _ := run(t, p.FromContainer, churn, ifB); ret != tcActOK {
				t.Fatalf("churn flow %d: verdict %d", i, ret)
			}
		}
		if i%8192 == 8191 {
			var e lxcCtEntry
			if p.CTAny.Lookup(&key, &e) != nil {
				break // evicted
			}
		}
	}
	var e lxcCtEntry
	if err := p.CTAny.Lookup(&key, &e); err == nil {
		t.Logf("ct_new %d ct_full %d entry %+v", metric(t, p, "ct_new"), metric(t, p, "ct_full"), e)
		t.Fatal("the revoked flow's conntrack entry survived the churn: the test proves nothing")
	}

	if ret, _ := run(t, p.FromContainer, reply, ifB); ret != tcActShot {
		t.Errorf("B's packet of the revoked flow after churn: verdict %d, want drop", ret)
	}
	if ret, _ := run(t, p.FromContainer, flow, ifA); ret != tcActShot {
		t.Errorf("A's packet of the revoked flow after churn: verdict %d, want drop", ret)
	}
	loadPolicy(t, n, c, revoked, policyFixture(ingressFromApp("a", "UDP", 7777)))
	if ret, _ := run(t, p.FromContainer, reply, ifB); ret != tcActRedirect {
		t.Errorf("B's packet after the grant: verdict %d, want redirect (the flow resumes)", ret)
	}
	if ret, _ := run(t, p.FromContainer, flow, ifA); ret != tcActRedirect {
		t.Errorf("A's packet after the grant: verdict %d, want redirect", ret)
	}
}

// TestRestartDoesNotKeepDeletedAllows: a policy deleted while the agent
// was down. The restarted agent's first apply only adds (it diffs against
// nothing), so a flow judged again before the prune still finds the
// stale allow; after the prune it must be judged once more and stop.
func TestRestartDoesNotKeepDeletedAllows(t *testing.T) {
	p, n, _ := eventNode(t)
	isolateB := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "isolate-b"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "b"}}}}
	loadPolicy(t, n, policy.NewCompiler(), nil, policyFixture(ingressFromApp("a", "UDP", 7777)))
	flow := udpFlow(podA, podB, 40000, 7777)
	if ret, _ := run(t, p.FromContainer, flow, ifA); ret != tcActRedirect {
		t.Fatalf("allowed flow: verdict %d, want redirect", ret)
	}
	// The allow was deleted while the agent was down; B stays isolated.
	res := loadPolicy(t, n, policy.NewCompiler(), nil, policyFixture(isolateB))
	if ret, _ := run(t, p.FromContainer, flow, ifA); ret != tcActRedirect {
		t.Logf("flow before the prune: verdict %d (the stale allow is already gone)", ret)
	}
	if err := n.PrunePolicy(res, policyEndpoints); err != nil {
		t.Fatal(err)
	}
	if ret, _ := run(t, p.FromContainer, flow, ifA); ret != tcActShot {
		t.Fatalf("flow after the prune: verdict %d, want drop: the deleted allow lives on", ret)
	}
}

// TestLaterFragmentsFollowTheirFlow: the fragments after the first carry
// no ports; they are judged as their first fragment's flow, allowed under
// a port-scoped allow, denied with a denied first fragment, and dropped
// when no first fragment was seen.
func TestLaterFragmentsFollowTheirFlow(t *testing.T) {
	p, n, _ := eventNode(t)
	loadPolicy(t, n, policy.NewCompiler(), nil, policyFixture(ingressFromApp("a", "UDP", 7777)))
	payload := make([]byte, 64)
	for _, c := range []struct {
		name  string
		dport uint16
		want  uint32
	}{{"allowed port", 7777, tcActRedirect}, {"denied port", 7778, tcActShot}} {
		id := c.dport
		first := asFragment(udpFlow(podA, podB, 40000, c.dport), id, 0, true)
		if ret, _ := run(t, p.FromContainer, first, ifA); ret != c.want {
			t.Errorf("%s: first fragment verdict %d, want %d", c.name, ret, c.want)
		}
		middle := laterFragment(podA, podB, 17, id, 4, true, payload)
		last := laterFragment(podA, podB, 17, id, 12, false, payload)
		for i, f := range [][]byte{middle, last} {
			if ret, _ := run(t, p.FromContainer, f, ifA); ret != c.want {
				t.Errorf("%s: fragment %d verdict %d, want %d", c.name, i+2, ret, c.want)
			}
		}
	}
	orphan := laterFragment(podA, podB, 17, 999, 4, false, payload)
	if ret, _ := run(t, p.FromContainer, orphan, ifA); ret != tcActShot {
		t.Errorf("fragment of no first fragment: verdict %d, want drop", ret)
	}
	if got := metric(t, p, "drop_fragment"); got != 1 {
		t.Errorf("drop_fragment = %d, want 1", got)
	}
	// A middle fragment reordered after the last still belongs to its flow.
	if ret, _ := run(t, p.FromContainer, laterFragment(podA, podB, 17, 7777, 8, true, payload), ifA); ret != tcActRedirect {
		t.Errorf("a middle fragment after the last: verdict %d, want redirect", ret)
	}
}

// TestICMPErrorFollowsItsFlow: with A's ingress closed, B's port
// unreachable about A's allowed datagram reaches A (so A fails at once
// instead of timing out), and so does a router's "fragmentation needed";
// an error quoting a flow that was never tracked does not.
func TestICMPErrorFollowsItsFlow(t *testing.T) {
	p, n, _ := eventNode(t)
	isolateA := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "isolate-a"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}}}}
	loadPolicy(t, n, policy.NewCompiler(), nil, policyFixture(ingressFromApp("a", "UDP", 7777), isolateA))
	flow := udpFlow(podA, podB, 40000, 7777)
	if ret, _ := run(t, p.FromContainer, flow, ifA); ret != tcActRedirect {
		t.Fatalf("A -> B:7777: verdict %d, want redirect", ret)
	}
	unreachable := icmpError(podB, podA, 3, 3, flow)
	if ret, _ := run(t, p.FromContainer, unreachable, ifB); ret != tcActRedirect {
		t.Errorf("port unreachable about the flow: verdict %d, want redirect to A", ret)
	}
	fragNeeded := icmpError(podB, podA, 3, 4, flow)
	if ret, _ := run(t, p.FromContainer, fragNeeded, ifB); ret != tcActRedirect {
		t.Errorf("fragmentation needed about the flow: verdict %d, want redirect to A", ret)
	}
	if got := metric(t, p, "ct_related"); got != 2 {
		t.Errorf("ct_related = %d, want 2", got)
	}
	stranger := icmpError(podB, podA, 3, 3, udpFlow(podA, podB, 40001, 7777))
	if ret, _ := run(t, p.FromContainer, stranger, ifB); ret != tcActShot {
		t.Errorf("error about an untracked flow: verdict %d, want drop", ret)
	}
	// A pod may only report on flows sent to it: A forging B's port
	// unreachable about B's own flow to the world reaches nothing.
	if ret, _ := run(t, p.FromContainer, udpFlow(podB, outside, 40200, 53), ifB); ret != tcActOK {
		t.Fatalf("B -> outside: verdict %d, want pass", ret)
	}
	forged := icmpError(podA, podB, 3, 3, udpFlow(podB, outside, 40200, 53))
	if ret, _ := run(t, p.FromContainer, forged, ifA); ret != tcActShot {
		t.Errorf("A's forged error about B's flow to the world: verdict %d, want drop", ret)
	}
	// An error must travel back to the quoted packet's sender.
	misdirected := icmpError(podA, podB, 3, 3, flow)
	if ret, _ := run(t, p.FromContainer, misdirected, ifA); ret == tcActRedirect && metric(t, p, "ct_related") != 2 {
		t.Errorf("an error sent to the quoted packet's destination passed as related")
	}
}

func addr4(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

func be16(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// TestGCRevokedFlowsForgetsOnlyQuietFlows: a revoked flow's record stays
// while it is younger than the idle time and goes once it is older.
func TestGCRevokedFlowsForgetsOnlyQuietFlows(t *testing.T) {
	p, n, _ := eventNode(t)
	c := policy.NewCompiler()
	granted := loadPolicy(t, n, c, nil, policyFixture(ingressFromApp("a", "UDP", 7777)))
	flow := udpFlow(podA, podB, 40000, 7777)
	run(t, p.FromContainer, flow, ifA)
	loadPolicy(t, n, c, granted, policyFixture(ingressFromApp("nothing", "UDP", 7777)))
	if ret, _ := run(t, p.FromContainer, flow, ifA); ret != tcActShot {
		t.Fatalf("revoked flow: verdict %d, want drop", ret)
	}
	if got, err := n.MapEntries(MapRevokedFlows, 0); err != nil || got != 1 {
		t.Fatalf("revoked flow records: %d (%v), want 1", got, err)
	}
	if got, err := n.GCRevokedFlows(time.Hour); err != nil || got != 0 {
		t.Fatalf("GC with an hour's idle deleted %d (%v), want 0", got, err)
	}
	if got, err := n.GCRevokedFlows(0); err != nil || got != 1 {
		t.Fatalf("GC with no idle deleted %d (%v), want 1", got, err)
	}
}

// TestUDPChurnSparesTCPFlows: TCP flows have a table of their own, so a
// flood of short UDP flows (DNS, or a pod churning on purpose) cannot
// evict an idle TCP connection, whose next segment (no SYN) could not
// start it again.
func TestUDPChurnSparesTCPFlows(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	if ret, _ := run(t, p.FromContainer, tcpFrame(hostMAC, podMAC, podA, podB, 40300, 80, 1, tcpSYN, nil), ifA); ret != tcActRedirect {
		t.Fatalf("SYN: verdict %d, want redirect", ret)
	}
	churn := udpFlow(podB, outside, 1, 9)
	for i := 0; i < int(2*p.CTAny.MaxEntries()); i++ {
		binary.BigEndian.PutUint16(churn[14+20:], uint16(i))
		churn[14+19] = byte(i >> 16)
		for range 2 {
			if ret, _ := run(t, p.FromContainer, churn, ifB); ret != tcActOK {
				t.Fatalf("churn flow %d: verdict %d", i, ret)
			}
		}
	}
	ack := tcpFrame(hostMAC, podMAC, podA, podB, 40300, 80, 2, tcpACK, []byte("still here"))
	if ret, _ := run(t, p.FromContainer, ack, ifA); ret != tcActRedirect {
		t.Fatalf("the idle TCP flow after UDP churn: verdict %d, want redirect", ret)
	}
}

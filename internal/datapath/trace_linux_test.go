package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/weirnet/weir/internal/policy"
)

// traceFixture: B's ingress rejects A on TCP 80 and UDP 7777 (Admin
// tier), denies A on TCP 81, accepts A on TCP 82, and a NetworkPolicy
// lets A reach B on UDP 53.
func traceFixture() (*policy.Snapshot, []*policy.ClusterPolicy) {
	deny := clusterPolicy(policy.KindClusterNetworkPolicy, "deny-81", npav1alpha2.AdminTier, 2, "b")
	deny.Spec.Ingress = []npav1alpha2.ClusterNetworkPolicyIngressRule{{
		Action: "Deny", From: []npav1alpha2.ClusterNetworkPolicyIngressPeer{fromApp("a")},
		Protocols: []npav1alpha2.ClusterNetworkPolicyProtocol{tcpPort(81)},
	}}
	accept := clusterPolicy(policy.KindClusterNetworkPolicy, "accept-82", npav1alpha2.AdminTier, 3, "b")
	accept.Spec.Ingress = []npav1alpha2.ClusterNetworkPolicyIngressRule{{
		Action: "Accept", From: []npav1alpha2.ClusterNetworkPolicyIngressPeer{fromApp("a")},
		Protocols: []npav1alpha2.ClusterNetworkPolicyProtocol{tcpPort(82)},
	}}
	return policyFixture(ingressFromApp("a", "UDP", 53)), []*policy.ClusterPolicy{rejectB(), deny, accept}
}

// TestTraceAgreesWithCompilerAndLeavesNoTrace traces flows a policy
// rejects, denies, accepts and allows, with the node's flow events off,
// holds the trace's verdict events to the compiled decisions, and checks
// the live conntrack table, event ring and counters did not change.
func TestTraceAgreesWithCompilerAndLeavesNoTrace(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	n := &Node{progs: p}
	defer n.closeTrace()
	live, err := n.OpenEventReader()
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	s, cps := traceFixture()
	s.ClusterPolicies = cps
	res := loadPolicy(t, n, policy.NewCompiler(), nil, s)
	// The node records no flows: a trace explains its packet all the same.
	if err := n.SetFlowEvents(false); err != nil {
		t.Fatal(err)
	}
	metricsBefore, err := readMetrics(p.Metrics)
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name        string
		pkt         TracePacket
		wantVerdict string
		wantIngress policy.Verdict
	}{
		{"reject tcp", TracePacket{Src: podA, Dst: podB, Proto: 6, Port: 80, SrcIfindex: ifA, DstIfindex: ifB}, "redirect", policy.VerdictReject},
		{"reject udp", TracePacket{Src: podA, Dst: podB, Proto: 17, Port: 7777, SrcIfindex: ifA, DstIfindex: ifB}, "redirect", policy.VerdictReject},
		{"deny", TracePacket{Src: podA, Dst: podB, Proto: 6, Port: 81, SrcIfindex: ifA, DstIfindex: ifB}, "shot", policy.VerdictDeny},
		{"accept", TracePacket{Src: podA, Dst: podB, Proto: 6, Port: 82, SrcIfindex: ifA, DstIfindex: ifB}, "redirect", policy.VerdictAllow},
		{"networkpolicy allow", TracePacket{Src: podA, Dst: podB, Proto: 17, Port: 53, SrcIfindex: ifA, DstIfindex: ifB}, "redirect", policy.VerdictAllow},
		{"networkpolicy default deny", TracePacket{Src: podA, Dst: podB, Proto: 17, Port: 54, SrcIfindex: ifA, DstIfindex: ifB}, "shot", policy.VerdictDeny},
		{"icmp default deny", TracePacket{Src: podA, Dst: podB, Proto: 1, SrcIfindex: ifA, DstIfindex: ifB}, "shot", policy.VerdictDeny},
		{"remote source", TracePacket{Src: remote, Dst: podB, Proto: 6, Port: 81, DstIfindex: ifB}, "shot", policy.VerdictDeny},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Twice: the private conntrack table must not remember the first.
			for range 2 {
				got, err := n.Trace(c.pkt)
				if err != nil {
					t.Fatal(err)
				}
				if got.TCVerdict != c.wantVerdict {
					t.Fatalf("%s: tc verdict %s, want %s", got.Program, got.TCVerdict, c.wantVerdict)
				}
				if err := checkTraceEvents(res, c.pkt, got.Events); err != nil {
					t.Fatal(err)
				}
				if last := got.Events[len(got.Events)-1]; last.Verdict != c.wantIngress {
					t.Fatalf("ingress verdict %s, want %s", last.Verdict, c.wantIngress)
				}
			}
		})
	}

	for _, m := range []*ebpf.Map{p.CT, p.CTAny, p.CTRevoked, p.Frags} {
		if k, err := anyKey(m); err != nil || k {
			t.Fatalf("live %s has entries (%v, err %v) after traces", m, k, err)
		}
	}
	live.ring.rd.SetDeadline(time.Now())
	if _, err := live.ring.rd.Read(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("live event ring: read %v, want nothing to read", err)
	}
	metricsAfter, err := readMetrics(p.Metrics)
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range metricsAfter {
		if metricsBefore[name] != v {
			t.Errorf("live metric %s changed: %d -> %d", name, metricsBefore[name], v)
		}
	}
}

// checkTraceEvents holds the events to the compiled decisions of the
// packet's local ends, source egress first.
func checkTraceEvents(res *policy.Result, pkt TracePacket, evs []VerdictEvent) error {
	pods := map[int]string{ifA: "x/a", ifB: "x/b"}
	var want []policy.Decision
	var wantIf []int
	if pkt.SrcIfindex != 0 {
		d := res.Lookup(pods[pkt.SrcIfindex], policy.Egress, pkt.Dst, pkt.Proto, pkt.Port)
		want, wantIf = append(want, d), append(wantIf, pkt.SrcIfindex)
	}
	if pkt.DstIfindex != 0 && (len(want) == 0 || want[0].Allowed()) {
		d := res.Lookup(pods[pkt.DstIfindex], policy.Ingress, pkt.Src, pkt.Proto, pkt.Port)
		want, wantIf = append(want, d), append(wantIf, pkt.DstIfindex)
	}
	if len(evs) != len(want) {
		return fmt.Errorf("%d events %+v, want %d", len(evs), evs, len(want))
	}
	for i, d := range want {
		ev := evs[i]
		if ev.Ifindex != wantIf[i] || ev.Verdict != d.Verdict || ev.Stage != d.Stage || ev.Rule != d.Rule || ev.Log != d.Log || ev.Passed != d.Passed {
			return fmt.Errorf("event %d %+v, compiler %+v on ifindex %d", i, ev, d, wantIf[i])
		}
	}
	return nil
}

func anyKey(m *ebpf.Map) (bool, error) {
	k := make([]byte, m.KeySize())
	err := m.NextKey(nil, &k)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return false, nil
	}
	return err == nil, err
}

// TestTraceRefusesWhatItCannotPlace: no local end, IPv6 and unknown
// protocols are errors, not guesses.
func TestTraceRefusesWhatItCannotPlace(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	n := &Node{progs: p}
	defer n.closeTrace()
	for _, pkt := range []TracePacket{
		{Src: remote, Dst: outside, Proto: 6, Port: 80},
		{Src: netip.MustParseAddr("fd00::1"), Dst: podB, Proto: 6, Port: 80, DstIfindex: ifB},
		{Src: podA, Dst: podB, Proto: 47, SrcIfindex: ifA, DstIfindex: ifB},
	} {
		if _, err := n.Trace(pkt); !errors.Is(err, ErrTraceUnsupported) {
			t.Errorf("trace %+v: %v, want ErrTraceUnsupported", pkt, err)
		}
	}
}

package datapath

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weirnet/weir/internal/policy"
)

// policyFixture is namespace x with the test's two local pods, A (app=a,
// on ifA) and B (app=b, on ifB), and a remote pod (app=a).
func policyFixture(policies ...*networkingv1.NetworkPolicy) *policy.Snapshot {
	ns := policy.Namespace{Name: "x", Labels: map[string]string{"kubernetes.io/metadata.name": "x"}}
	s := &policy.Snapshot{
		Namespaces: map[string]policy.Namespace{"x": ns},
		Pods: []policy.Pod{
			{Namespace: "x", Name: "a", Labels: map[string]string{"app": "a"}, IPs: []netip.Addr{podA}, Local: true},
			{Namespace: "x", Name: "b", Labels: map[string]string{"app": "b"}, IPs: []netip.Addr{podB}, Local: true},
			{Namespace: "x", Name: "r", Labels: map[string]string{"app": "a"}, IPs: []netip.Addr{remote}},
		},
		Policies:   policies,
		Identities: map[string]policy.Identity{},
		HostIPs:    []netip.Addr{netip.MustParseAddr("10.99.0.11")},
	}
	for i, p := range s.Pods {
		s.Identities[policy.IdentityLabels(ns, p.Labels).Key()] = policy.MinClusterIdentity + policy.Identity(i)
	}
	return s
}

var policyEndpoints = map[string]PolicyEndpoint{"x/a": {Ifindex: ifA}, "x/b": {Ifindex: ifB}}

// loadPolicy compiles s and applies the difference from prev.
func loadPolicy(t *testing.T, n *Node, c *policy.Compiler, prev *policy.Result, s *policy.Snapshot) *policy.Result {
	t.Helper()
	res := c.Compile(s)
	if len(res.Errors) > 0 {
		t.Fatalf("compile: %v", res.Errors)
	}
	eps := map[string]PolicyEndpoint{}
	for pod, ep := range policyEndpoints {
		if e, ok := res.Endpoints[pod]; ok {
			ep.Identity = e.Identity
		}
		eps[pod] = ep
	}
	if err := n.ApplyPolicy(policy.DiffResults(prev, res), eps); err != nil {
		t.Fatalf("apply policy: %v", err)
	}
	return res
}

// udpFrameTo is udpFrame with the destination port set.
func udpFrameTo(src, dst netip.Addr, dport uint16) []byte {
	f := udpFrame(hostMAC, podMAC, src, dst, []byte("x"))
	binary.BigEndian.PutUint16(f[14+20+2:], dport)
	return f
}

func ingressFromApp(app string, proto string, ports ...int32) *networkingv1.NetworkPolicy {
	p := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "allow-" + app}}
	p.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "b"}}
	rule := networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}}}
	for _, port := range ports {
		v, pr := intstr.FromInt32(port), networkingv1.NetworkPolicyPort{}
		pr.Port = &v
		protocol := corev1Protocol(proto)
		pr.Protocol = &protocol
		rule.Ports = append(rule.Ports, pr)
	}
	p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{rule}
	return p
}

// eventNode loads the test programs and opens their verdict events.
func eventNode(t *testing.T) (*Programs, *Node, *EventReader) {
	t.Helper()
	return eventNodeMode(t, ModeVXLAN)
}

// eventNodeMode is eventNode in the given routing mode.
func eventNodeMode(t *testing.T, mode Mode) (*Programs, *Node, *EventReader) {
	t.Helper()
	p := loadTest(t, mode)
	n := &Node{progs: p}
	rd, err := n.OpenEventReader()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Close() })
	return p, n, rd
}

func TestPolicyVerdictsAndEvents(t *testing.T) {
	p, n, rd := eventNode(t)
	c := policy.NewCompiler()

	res := loadPolicy(t, n, c, nil, policyFixture(ingressFromApp("a", "UDP", 7777)))
	allowRule := res.Lookup("x/b", policy.Ingress, podA, 17, 7777).Rule
	if ret, _ := run(t, p.FromContainer, udpFrameTo(podA, podB, 7777), ifA); ret != tcActRedirect {
		t.Fatalf("allowed flow A->B:7777: verdict %d, want redirect", ret)
	}
	// One event per local end: A's egress (no policy selects A), then B's
	// ingress, allowed by the rule.
	ev := readEvent(t, rd)
	if ev.Verdict != policy.VerdictAllow || ev.Ifindex != ifA || ev.Direction != policy.Egress || ev.Rule != 0 {
		t.Fatalf("egress event %+v, want allowed egress of ifindex %d with no rule", ev, ifA)
	}
	ev = readEvent(t, rd)
	if ev.Verdict != policy.VerdictAllow || ev.Ifindex != ifB || ev.Direction != policy.Ingress || ev.Rule != allowRule ||
		ev.Src != netip.AddrPortFrom(podA, 40000) || ev.Dst != netip.AddrPortFrom(podB, 7777) || ev.Proto != 17 {
		t.Fatalf("allow event %+v, want allowed ingress of ifindex %d by rule %d", ev, ifB, allowRule)
	}
	if ret, _ := run(t, p.FromContainer, udpFrameTo(podA, podB, 7778), ifA); ret != tcActShot {
		t.Fatalf("A->B:7778 (port not allowed): verdict %d, want drop", ret)
	}
	if ev = readEvent(t, rd); ev.Direction != policy.Egress || ev.Verdict != policy.VerdictAllow {
		t.Fatalf("egress event %+v, want allowed", ev)
	}
	ev = readEvent(t, rd)
	if ev.Verdict != policy.VerdictDeny || ev.Ifindex != ifB || ev.Rule != 0 || ev.Dst.Port() != 7778 {
		t.Fatalf("deny event %+v", ev)
	}
	dropsBefore := metric(t, p, "drop_policy")

	// Revoking the allow stops the established flow on its next packet.
	revoked := loadPolicy(t, n, c, res, policyFixture(ingressFromApp("nothing", "UDP", 7777)))
	if ret, _ := run(t, p.FromContainer, udpFrameTo(podA, podB, 7777), ifA); ret != tcActShot {
		t.Fatalf("established flow after revoke: verdict %d, want drop", ret)
	}
	if got := metric(t, p, "drop_policy"); got != dropsBefore+1 {
		t.Fatalf("drop_policy %d, want %d", got, dropsBefore+1)
	}
	if ev = readEvent(t, rd); ev.Verdict != policy.VerdictDeny || ev.Dst.Port() != 7777 || ev.Peer != res.Endpoints["x/a"].Identity {
		t.Fatalf("revoke event %+v", ev)
	}
	// The revoked flow stays closed from the other end too: B's next
	// packet to A must not open a reverse flow (B's egress and A's
	// ingress are unrestricted) that A's packets would then ride on.
	reply := udpFrameTo(podB, podA, 40000)
	binary.BigEndian.PutUint16(reply[14+20:], 7777)
	if ret, _ := run(t, p.FromContainer, reply, ifB); ret != tcActShot {
		t.Fatalf("reply B->A of the revoked flow: verdict %d, want drop", ret)
	}
	if ret, _ := run(t, p.FromContainer, udpFrameTo(podA, podB, 7777), ifA); ret != tcActShot {
		t.Fatalf("revoked flow A->B after a reply: verdict %d, want drop", ret)
	}
	// Granting again reopens the same flow on its next packet.
	loadPolicy(t, n, c, revoked, policyFixture(ingressFromApp("a", "UDP", 7777)))
	if ret, _ := run(t, p.FromContainer, udpFrameTo(podA, podB, 7777), ifA); ret != tcActRedirect {
		t.Fatalf("re-granted flow A->B: verdict %d, want redirect", ret)
	}
}

// TestPolicyDatapathAgreesWithCompiler runs generated packets through
// from_container and compares each verdict with the compiled result's
// own lookup (egress of A, then ingress of B): the datapath must decide
// exactly what the compiler says, across protocols, ports and ranges.
func TestPolicyDatapathAgreesWithCompiler(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	n := &Node{progs: p}
	c := policy.NewCompiler()
	rangePolicy := ingressFromApp("a", "UDP", 7000)
	end := int32(7100)
	rangePolicy.Spec.Ingress[0].Ports[0].EndPort = &end
	egress := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "a-egress"}}
	egress.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}}
	egress.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	egress.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{
		To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.244.1.0/24", Except: []string{"10.244.1.2/32"}}}},
		Ports: ingressFromApp("a", "UDP", 7050, 7777, 9000).Spec.Ingress[0].Ports,
	}}
	variants := [][]*networkingv1.NetworkPolicy{
		nil,
		{ingressFromApp("a", "UDP", 7777)},
		{ingressFromApp("a", "TCP", 7777)},
		{rangePolicy},
		{rangePolicy, egress},
		{egress},
	}
	var prev *policy.Result
	checked := 0
	for vi, v := range variants {
		prev = loadPolicy(t, n, c, prev, policyFixture(v...))
		for _, port := range []uint16{1, 6999, 7000, 7001, 7050, 7063, 7064, 7099, 7100, 7101, 7777, 9000, 65535} {
			// A fresh source port per run: a new flow, judged from scratch.
			frame := udpFrameTo(podA, podB, port)
			binary.BigEndian.PutUint16(frame[14+20:], uint16(20000+vi*100+checked%100))
			egressOK := prev.Lookup("x/a", policy.Egress, podB, 17, port).Allowed()
			ingressOK := prev.Lookup("x/b", policy.Ingress, podA, 17, port).Allowed()
			want := uint32(tcActShot)
			if egressOK && ingressOK {
				want = tcActRedirect
			}
			if ret, _ := run(t, p.FromContainer, frame, ifA); ret != want {
				t.Errorf("variant %d, A->B udp/%d: datapath %d, compiler says egress %v ingress %v", vi, port, ret, egressOK, ingressOK)
			}
			checked++
		}
	}
	t.Logf("%d packets, datapath and compiler agree", checked)
}

func readEvent(t *testing.T, rd *EventReader) VerdictEvent {
	t.Helper()
	type result struct {
		ev  VerdictEvent
		err error
	}
	ch := make(chan result, 1)
	go func() {
		ev, err := rd.Read()
		ch <- result{ev, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if d := time.Since(r.ev.Time); d < -time.Second || d > time.Minute {
			t.Fatalf("event time %v is %v from now", r.ev.Time, d)
		}
		return r.ev
	case <-time.After(3 * time.Second):
		t.Fatal(errors.New("no verdict event within 3 s"))
	}
	panic("unreachable")
}

func corev1Protocol(p string) corev1.Protocol { return corev1.Protocol(p) }

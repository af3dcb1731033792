package datapath

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/weirnet/weir/internal/policy"
)

// orderProbe is one packet a pod sends: UDP from the pod's address.
type orderProbe struct {
	pod     string // x/a or x/b
	dst     netip.Addr
	dport   uint16
	ifindex uint32
	src     netip.Addr
}

// orderProbes are the packets judged between every two writes: both local
// pods towards the addresses the policies below carve up, and each other.
func orderProbes() []orderProbe {
	var out []orderProbe
	for _, from := range []struct {
		pod     string
		src     netip.Addr
		ifindex uint32
	}{{"x/a", podA, ifA}, {"x/b", podB, ifB}} {
		for _, d := range []string{"198.51.100.5", "198.51.100.200", "203.0.113.5", "203.0.113.130", "192.0.2.1"} {
			out = append(out, orderProbe{from.pod, netip.MustParseAddr(d), 53, from.ifindex, from.src})
		}
	}
	out = append(out, orderProbe{"x/a", podB, 7777, ifA, podA}, orderProbe{"x/b", podA, 7777, ifB, podB})
	return out
}

// allows reports whether res lets the probe through: its pod's egress and,
// towards a local pod, that pod's ingress.
func (pr orderProbe) allowedBy(res *policy.Result) bool {
	if res.Lookup(pr.pod, policy.Egress, pr.dst, 17, pr.dport).Verdict != policy.VerdictAllow {
		return false
	}
	for pod, addr := range map[string]netip.Addr{"x/a": podA, "x/b": podB} {
		if addr == pr.dst {
			return res.Lookup(pod, policy.Ingress, pr.src, 17, pr.dport).Verdict == policy.VerdictAllow
		}
	}
	return true
}

func (pr orderProbe) String() string {
	return fmt.Sprintf("%s -> %v:%d", pr.pod, pr.dst, pr.dport)
}

// runProbes sends every probe through the programs, each from a fresh
// source port (a tracked flow would not be judged again before the
// revision bump), and says which got through.
func runProbes(t *testing.T, p *Programs, probes []orderProbe, sport *uint16) []bool {
	t.Helper()
	out := make([]bool, len(probes))
	for i, pr := range probes {
		*sport++
		f := udpFrameTo(pr.src, pr.dst, pr.dport)
		binary.BigEndian.PutUint16(f[14+20:], *sport)
		ret, _ := run(t, p.FromContainer, f, pr.ifindex)
		out[i] = ret != tcActShot
	}
	return out
}

// denyBDocNet is an Admin Deny of B's egress to 198.51.100.0/24.
func denyBDocNet() *policy.ClusterPolicy {
	denyB := clusterPolicy(policy.KindClusterNetworkPolicy, "b-no-doc-net", npav1alpha2.AdminTier, 1, "b")
	denyB.Spec.Egress = []npav1alpha2.ClusterNetworkPolicyEgressRule{{Name: "deny", Action: "Deny",
		To: []npav1alpha2.ClusterNetworkPolicyEgressPeer{{Networks: []npav1alpha2.CIDR{"198.51.100.0/24"}}}}}
	return denyB
}

func egressIPBlock(name, pod, cidr string, except ...string) *networkingv1.NetworkPolicy {
	p := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: name}}
	p.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": pod}}
	p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	p.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{
		IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}}}}
	return p
}

// TestEveryIntermediateStateIsBounded applies a sequence of policy changes
// and, after every single map write, sends each probe through the real
// programs: no state between two writes may let a packet through that
// both the old and the new policy deny. The changes are the ones whose
// order matters: a new CIDR prefix under an Admin Deny of the prefix
// around it (its addresses move to a new identity, which must carry the
// Deny before any address carries it), an allow with an except (the
// except before the prefix it carves from), an allow of a prefix that
// already exists while a new except carves from it (the excepted
// addresses must not meet the new allow under their old identity), and
// their removal (the keys of a prefix must outlive its addresses).
func TestEveryIntermediateStateIsBounded(t *testing.T) {
	p, n, _ := eventNode(t)
	c := policy.NewCompiler()
	denyB := denyBDocNet()
	aToB := egressIPBlock("a-to-b", "a", podB.String()+"/32")
	states := [][]*networkingv1.NetworkPolicy{
		{aToB},
		{aToB, egressIPBlock("a-upper-half", "a", "198.51.100.128/25")},
		{aToB, egressIPBlock("a-upper-half", "a", "198.51.100.128/25"), egressIPBlock("a-test-net", "a", "203.0.113.0/24", "203.0.113.0/28")},
		{aToB, egressIPBlock("a-test-net", "a", "203.0.113.0/24", "203.0.113.0/28"), egressIPBlock("b-doc-net", "b", "198.51.100.0/24")},
		{aToB, egressIPBlock("a-test-net", "a", "203.0.113.0/24", "203.0.113.0/28"), egressIPBlock("b-doc-net", "b", "198.51.100.0/24"),
			egressIPBlock("a-doc-net", "a", "198.51.100.0/24", "198.51.100.128/25")},
		{aToB},
		nil,
	}
	probes := orderProbes()
	sport := uint16(20000)
	verdicts := func() []bool { return runProbes(t, p, probes, &sport) }

	// As the agent does, each pod is closed until its first policy load
	// (IsolateEndpoint): the state before the first step denies all.
	for _, idx := range []uint32{ifA, ifB} {
		if err := p.EpPolicy.Put(idx, lxcEpPolicy{Enforce: [2]uint8{enforceNetworkPolicy, enforceNetworkPolicy}}); err != nil {
			t.Fatal(err)
		}
	}
	var prev *policy.Result
	for step, nps := range states {
		s := policyFixture(nps...)
		s.ClusterPolicies = []*policy.ClusterPolicy{denyB}
		next := c.Compile(s)
		if len(next.Errors) > 0 {
			t.Fatalf("step %d: compile: %v", step, next.Errors)
		}
		writes := 0
		seq := p.policySeq.count.Load()
		n.afterWrite = func() {
			writes++
			// Each write was counted before it landed (policy.h).
			if got := p.policySeq.count.Load(); got != seq+1 {
				t.Errorf("step %d, write %d: weir_policy_seq went from %d to %d, want one more", step, writes, seq, got)
			}
			seq = p.policySeq.count.Load()
			for i, got := range verdicts() {
				pr := probes[i]
				if got && !pr.allowedBy(next) && (prev == nil || !pr.allowedBy(prev)) {
					t.Errorf("step %d, after write %d: %v got through; the old and the new policy deny it", step, writes, pr)
				}
			}
		}
		err := n.ApplyPolicy(policy.DiffResults(prev, next), endpointsOf(next))
		n.afterWrite = nil
		if err != nil {
			t.Fatalf("step %d: apply: %v", step, err)
		}
		for i, got := range verdicts() {
			if want := probes[i].allowedBy(next); got != want {
				t.Errorf("step %d applied: %v allowed=%v, the policy says %v", step, probes[i], got, want)
			}
		}
		t.Logf("step %d: %d writes", step, writes)
		prev = next
	}
}

// TestDecisionStraddlingWritesIsReadAgain: while the agent rewrites the
// policy over and over, pod A's decisions towards B are read from one
// state each. A swaps labels (app=a, app=c) and B's allow swaps with it,
// so both states deny A -> B; only a decision that read A's identity in
// one state and B's keys in another could let it through. The writes are
// counted (weir_policy_seq) and the datapath read some decision again.
func TestDecisionStraddlingWritesIsReadAgain(t *testing.T) {
	p, n, _ := eventNode(t)
	c := policy.NewCompiler()
	state := func(aLabel, allowed string) *policy.Result {
		s := policyFixture(ingressFromApp(allowed, "UDP", 7777))
		s.Pods[0].Labels = map[string]string{"app": aLabel}
		ns := s.Namespaces["x"]
		s.Identities[policy.IdentityLabels(ns, map[string]string{"app": "c"}).Key()] = policy.MinClusterIdentity + 10
		res := c.Compile(s)
		if len(res.Errors) > 0 {
			t.Fatalf("compile: %v", res.Errors)
		}
		if res.Lookup("x/b", policy.Ingress, podA, 17, 7777).Verdict == policy.VerdictAllow {
			t.Fatalf("A (app=%s) -> B allowed from app=%s: the fixture must deny it", aLabel, allowed)
		}
		return res
	}
	states := []*policy.Result{state("a", "c"), state("c", "a")}
	if err := n.ApplyPolicy(policy.DiffResults(nil, states[0]), endpointsOf(states[0])); err != nil {
		t.Fatal(err)
	}

	stop, done := make(chan struct{}), make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			prev, next := states[i%2], states[(i+1)%2]
			if err := n.ApplyPolicy(policy.DiffResults(prev, next), endpointsOf(next)); err != nil {
				done <- err
				return
			}
		}
	}()
	f := udpFrameTo(podA, podB, 7777)
	deadline := time.Now().Add(20 * time.Second)
	runs := 0
	for ; time.Now().Before(deadline) && (runs < 20000 || metric(t, p, "policy_reread") == 0); runs++ {
		binary.BigEndian.PutUint16(f[14+20:], uint16(10000+runs%50000))
		if ret, _ := run(t, p.FromContainer, f, ifA); ret != tcActShot {
			t.Errorf("run %d: A -> B:7777 got through (verdict %d); every state denies it", runs, ret)
			break
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatalf("apply: %v", err)
	}
	rereads, gaveUp := metric(t, p, "policy_reread"), metric(t, p, "drop_policy_changing")
	t.Logf("%d decisions, %d read again, %d denied as still changing", runs, rereads, gaveUp)
	if rereads == 0 {
		t.Errorf("no decision was read again in %d runs beside a writer: the straddle check never fired", runs)
	}
}

// TestReloadAfterRestartChangesNoVerdict: an agent that restarts loads
// its whole state again (a diff from nothing) over the pinned maps that
// already hold it. No address already in place may pass through
// "unidentified" on the way: between every two writes, every probe keeps
// the verdict it had, so a restart drops no new connection.
func TestReloadAfterRestartChangesNoVerdict(t *testing.T) {
	p, n, _ := eventNode(t)
	c := policy.NewCompiler()
	denyB := denyBDocNet()
	s := policyFixture(egressIPBlock("a-to-b", "a", podB.String()+"/32"),
		egressIPBlock("a-test-net", "a", "203.0.113.0/24", "203.0.113.0/28"), egressIPBlock("b-doc-net", "b", "198.51.100.0/24"))
	s.ClusterPolicies = []*policy.ClusterPolicy{denyB}
	res := c.Compile(s)
	if err := n.ApplyPolicy(policy.DiffResults(nil, res), endpointsOf(res)); err != nil {
		t.Fatal(err)
	}
	probes := orderProbes()
	sport := uint16(30000)
	n.afterWrite = func() {
		for i, got := range runProbes(t, p, probes, &sport) {
			if want := probes[i].allowedBy(res); got != want {
				t.Errorf("during the reload: %v allowed=%v, the policy says %v", probes[i], got, want)
			}
		}
	}
	defer func() { n.afterWrite = nil }()
	restarted := policy.NewCompiler().Compile(s)
	if err := n.ApplyPolicy(policy.DiffResults(nil, restarted), endpointsOf(restarted)); err != nil {
		t.Fatal(err)
	}
}

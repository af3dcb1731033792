package datapath

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/policy"
)

// fullDecoy returns a map shaped like m that holds one entry and has room
// for no other: every write of a new key to it fails, as to a full map.
func fullDecoy(t *testing.T, m *ebpf.Map, key, value any) *ebpf.Map {
	t.Helper()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	d, err := ebpf.NewMap(&ebpf.MapSpec{Type: info.Type, KeySize: info.KeySize, ValueSize: info.ValueSize,
		MaxEntries: 1, Flags: info.Flags})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Put(key, value); err != nil {
		t.Fatal(err)
	}
	return d
}

// ipBlockToB allows B's ingress on UDP 7777 from 192.0.2.0/24 except
// the address outside.
func ipBlockToB() *networkingv1.NetworkPolicy {
	p := ingressFromApp("a", "UDP", 7777)
	p.Name = "ipblock-b"
	p.Spec.Ingress[0].From = []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{
		CIDR: "192.0.2.0/24", Except: []string{outside.String() + "/32"}}}}
	return p
}

// TestFailedApplyClosesEndpoints: when a CIDR entry cannot be written,
// every enforcing endpoint is closed before any allow of the new state
// lands (a missing except must not turn into an allow); when a new pod's
// address cannot enter the ipcache, that pod stays unidentified (denied)
// and nothing else changes; when a policy key cannot be written, its
// endpoint is closed. A closed endpoint
// denies everything, with verdict stage "closed", until an apply of the
// whole state succeeds.
func TestFailedApplyClosesEndpoints(t *testing.T) {
	p, n, rd := eventNode(t)
	c := policy.NewCompiler()
	base := loadPolicy(t, n, c, nil, policyFixture(ingressFromApp("a", "UDP", 7777)))
	if ret, _ := run(t, p.FromContainer, udpFlow(podA, podB, 40000, 7777), ifA); ret != tcActRedirect {
		t.Fatalf("allowed flow: verdict %d, want redirect", ret)
	}
	drain(rd)

	// The CIDR map is full: the except cannot be written.
	realCIDRs := p.CIDRIDs
	p.CIDRIDs = fullDecoy(t, realCIDRs, lxcCidrKey{Prefixlen: 64}, uint32(1))
	next := c.Compile(policyFixture(ingressFromApp("a", "UDP", 7777), ipBlockToB()))
	eps := endpointsOf(next)
	err := n.ApplyPolicy(policy.DiffResults(base, next), eps)
	if !errors.Is(err, ErrPolicyClosed) {
		t.Fatalf("apply with a full CIDR map: %v, want ErrPolicyClosed", err)
	}
	p.CIDRIDs = realCIDRs
	if ret, _ := run(t, p.FromOverlay, udpFlow(outside, podB, 40001, 7777), 99); ret != tcActShot {
		t.Errorf("the excepted address after the failed apply: verdict %d, want drop", ret)
	}
	if ev := readEvent(t, rd); ev.Stage != policy.StageClosed || ev.Verdict != policy.VerdictDeny {
		t.Errorf("event %+v, want denied at stage closed", ev)
	}
	if ret, _ := run(t, p.FromContainer, udpFlow(podA, podB, 40000, 7777), ifA); ret != tcActShot {
		t.Errorf("the established flow into the closed endpoint: verdict %d, want drop", ret)
	}
	drain(rd)

	// The whole state applied again: open exactly as the policy says.
	if err := n.ApplyPolicy(policy.DiffResults(nil, next), eps); err != nil {
		t.Fatal(err)
	}
	if err := n.PrunePolicy(next, eps); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		src  netip.Addr
		want uint32
	}{{outside, tcActShot}, {netip.MustParseAddr("192.0.2.11"), tcActRedirect}} {
		if ret, _ := run(t, p.FromOverlay, udpFlow(c.src, podB, 40002, 7777), 99); ret != c.want {
			t.Errorf("%v -> B after the retry: verdict %d, want %d", c.src, ret, c.want)
		}
	}
	if ret, _ := run(t, p.FromContainer, udpFlow(podA, podB, 40000, 7777), ifA); ret != tcActRedirect {
		t.Errorf("A -> B:7777 after the retry: verdict %d, want redirect", ret)
	}

	// The ipcache is full: a new pod's identity cannot be written.
	realIPCache := p.IPCache
	p.IPCache = fullDecoy(t, realIPCache, lxcWeirAddr{Family: 2}, uint32(1))
	withNewPod := policyFixture(ingressFromApp("a", "UDP", 7777), ipBlockToB())
	withNewPod.Pods = append(withNewPod.Pods, policy.Pod{Namespace: "x", Name: "c", Labels: map[string]string{"app": "a"},
		IPs: []netip.Addr{netip.MustParseAddr("10.244.2.9")}})
	grown := c.Compile(withNewPod)
	err = n.ApplyPolicy(policy.DiffResults(next, grown), endpointsOf(grown))
	p.IPCache = realIPCache
	if !errors.Is(err, ErrPolicyClosed) {
		t.Fatalf("apply with a full ipcache: %v, want ErrPolicyClosed", err)
	}
	// Only the pod left out is closed: it is unidentified, denied where
	// policy applies; every endpoint keeps its exact verdicts.
	if ret, _ := run(t, p.FromContainer, udpFlow(podA, podB, 40004, 7777), ifA); ret != tcActRedirect {
		t.Errorf("A -> B:7777 after the ipcache failed: verdict %d, want redirect (A's verdicts unchanged)", ret)
	}
	withPeers(t, p)
	if ret := runOverlay(t, p, udpFlow(netip.MustParseAddr("10.244.2.9"), podB, 40005, 7777), ownerNode, 0); ret != tcActShot {
		t.Errorf("the pod the ipcache could not take -> B:7777: verdict %d, want drop (unidentified)", ret)
	}
	if err := n.ApplyPolicy(policy.DiffResults(nil, grown), endpointsOf(grown)); err != nil {
		t.Fatal(err)
	}
	next = grown

	// The policy map is full: B's new keys cannot be written.
	realPolicy := p.Policy
	p.Policy = fullDecoy(t, realPolicy, lxcPolicyKey{Prefixlen: 96}, lxcPolicyEntry{})
	third := c.Compile(policyFixture(ingressFromApp("a", "UDP", 7777, 7778)))
	err = n.ApplyPolicy(policy.DiffResults(next, third), endpointsOf(third))
	p.Policy = realPolicy
	if !errors.Is(err, ErrPolicyClosed) {
		t.Fatalf("apply with a full policy map: %v, want ErrPolicyClosed", err)
	}
	if ret, _ := run(t, p.FromContainer, udpFlow(podA, podB, 40003, 7778), ifA); ret != tcActShot {
		t.Errorf("A -> B:7778 with B's keys unwritten: verdict %d, want drop", ret)
	}
}

func endpointsOf(res *policy.Result) map[string]PolicyEndpoint {
	eps := map[string]PolicyEndpoint{}
	for pod, ep := range policyEndpoints {
		if e, ok := res.Endpoints[pod]; ok {
			ep.Identity = e.Identity
		}
		eps[pod] = ep
	}
	return eps
}

// drain discards the events waiting in rd.
func drain(rd *EventReader) {
	rd.ring.rd.SetDeadline(time.Unix(1, 0)) // in the past: never wait
	for {
		if _, err := rd.ring.rd.Read(); err != nil {
			return
		}
	}
}

// TestConditionalClusterRulesClose: a cluster rule with HTTP rules, on
// a node that reads no requests, must not be written without them (its
// Deny would be lost): the endpoint it selects is closed, and the apply
// says why.
func TestConditionalClusterRulesClose(t *testing.T) {
	p, n, rd := eventNode(t)
	c := policy.NewCompiler()
	base := loadPolicy(t, n, c, nil, policyFixture())
	cnp := &policy.ClusterPolicy{Kind: policy.KindWeirClusterNetworkPolicy, Name: "no-put",
		HTTP: &policy.ClusterHTTP{Ingress: [][]l7.Rule{{{Method: "PUT"}}}}}
	cnp.Spec.Tier = npav1alpha2.AdminTier
	cnp.Spec.Subject.Pods = &npav1alpha2.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "b"}}}
	cnp.Spec.Ingress = []npav1alpha2.ClusterNetworkPolicyIngressRule{{Action: "Deny",
		From:      []npav1alpha2.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}},
		Protocols: []npav1alpha2.ClusterNetworkPolicyProtocol{{TCP: &npav1alpha2.ClusterNetworkPolicyProtocolTCP{DestinationPort: &npav1alpha2.Port{Number: 7777}}}}}}
	s := policyFixture()
	s.ClusterPolicies = []*policy.ClusterPolicy{cnp}
	next := c.Compile(s)
	if len(next.Errors) > 0 {
		t.Fatal(next.Errors)
	}
	err := n.ApplyPolicy(policy.DiffResults(base, next), endpointsOf(next))
	if !errors.Is(err, ErrConditionalRules) || !errors.Is(err, ErrPolicyClosed) {
		t.Fatalf("apply: %v, want ErrConditionalRules and ErrPolicyClosed", err)
	}
	drain(rd)
	if ret, _ := run(t, p.FromContainer, udpFrameTo(podA, podB, 53), ifA); ret != tcActShot {
		t.Errorf("a flow into the endpoint the rule selects: verdict %d, want drop", ret)
	}
	// The sender's egress (unenforced) reports first, then the
	// receiver's ingress: closed.
	if ev := readEvent(t, rd); ev.Direction != policy.Egress || ev.Stage != policy.StageUnenforced {
		t.Errorf("first event %+v, want the sender's egress, unenforced", ev)
	}
	if ev := readEvent(t, rd); ev.Direction != policy.Ingress || ev.Stage != policy.StageClosed || ev.Verdict != policy.VerdictDeny {
		t.Errorf("event %+v, want the receiver's ingress denied at stage closed", ev)
	}
}

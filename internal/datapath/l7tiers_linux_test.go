package datapath

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/policy"
)

// tierRule is an Admin ingress rule into app=b on TCP port 80 from every
// namespace, with HTTP rules (none: an L4 rule).
type tierRule struct {
	action string
	http   []l7.Rule
}

func tierPolicy(name string, rules ...tierRule) *policy.ClusterPolicy {
	p := &policy.ClusterPolicy{Kind: policy.KindWeirClusterNetworkPolicy, Name: name}
	p.Spec.Tier, p.Spec.Priority = npav1alpha2.AdminTier, 10
	p.Spec.Subject.Pods = &npav1alpha2.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "b"}}}
	for _, r := range rules {
		p.AddIngress(npav1alpha2.ClusterNetworkPolicyIngressRule{Action: npav1alpha2.ClusterNetworkPolicyRuleAction(r.action),
			From: []npav1alpha2.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}},
			Protocols: []npav1alpha2.ClusterNetworkPolicyProtocol{{TCP: &npav1alpha2.ClusterNetworkPolicyProtocolTCP{
				DestinationPort: &npav1alpha2.Port{Number: 80}}}}}, r.http)
	}
	return p
}

// TestTieredEntries: on a node that reads requests, an entry with
// conditional cluster rules is written with its set marked tiered
// (L7SetTiered), no rows of that set in the kernel's tables, and its tier
// match in the form the kernel decides by: a conditional Deny first
// leaves the SYN to the default (allowed, its flow judged in user
// space); a conditional Accept before a Deny of all lets the connection
// on; a Deny of all first drops the SYN. Traffic the rules do not cover
// is untouched.
func TestTieredEntries(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	s, err := AttachL7Sockets(l7TestCgroup(t), L7FlowMaps{In: p.L7Flows, Out: p.L7Out})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	n := &Node{progs: p}
	if err := n.EnableL7(s); err != nil {
		t.Fatal(err)
	}
	put := []l7.Rule{{Method: "PUT"}}
	health := []l7.Rule{{Method: "GET", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/healthz"}}}
	c := policy.NewCompiler()
	var prev *policy.Result
	for i, tc := range []struct {
		name   string
		policy *policy.ClusterPolicy
		synOK  bool
	}{
		{"a conditional Deny", tierPolicy("no-put", tierRule{"Deny", put}), true},
		{"a conditional Accept before a Deny of all", tierPolicy("health-only", tierRule{"Accept", health}, tierRule{"Deny", nil}), true},
		{"a Deny of all before a conditional Accept", tierPolicy("deny-first", tierRule{"Deny", nil}, tierRule{"Accept", health}), false},
	} {
		snap := policyFixture()
		snap.ClusterPolicies = []*policy.ClusterPolicy{tc.policy}
		res := loadPolicy(t, n, c, prev, snap)
		prev = res
		tieredKeys := 0
		for k, e := range res.Endpoints["x/b"].Entries {
			if e.Tiers == 0 {
				continue
			}
			tieredKeys++
			var v lxcPolicyEntry
			if err := p.Policy.Lookup(policyKey(ifB, k), &v); err != nil {
				t.Fatalf("%s: entry %v: %v", tc.name, k, err)
			}
			if v.Http&L7SetTiered == 0 || v.Http&^L7SetTiered != n.l7.base+uint32(e.L7) {
				t.Fatalf("%s: entry %v written with set %#x, want set %d marked tiered", tc.name, k, v.Http, e.L7)
			}
			var row l7L7Set
			if err := s.objs.WeirL7Sets.Lookup(v.Http&^L7SetTiered, &row); !errors.Is(err, ebpf.ErrKeyNotExist) {
				t.Fatalf("%s: the tiered set's rules are in the kernel's tables (%v): they are judged in user space", tc.name, err)
			}
			m := e.KernelTier(policy.TierAdmin)
			if got := v.Tier[policy.TierAdmin]; got.Rule != uint32(m.Rule) || got.Rank != m.Rank || got.Action != uint8(m.Action) {
				t.Fatalf("%s: entry %v's Admin match %+v, want %+v", tc.name, k, got, m)
			}
		}
		if tieredKeys == 0 && tc.synOK {
			t.Fatalf("%s: no entry of x/b has conditional rules", tc.name)
		}
		client, server := netip.AddrPortFrom(podA, uint16(40700+i)), netip.AddrPortFrom(podB, 80)
		syn := tcpFrame(hostMAC, podMAC, podA, podB, client.Port(), server.Port(), 1, tcpSYN, nil)
		ret, _ := run(t, p.FromContainer, syn, ifA)
		if !tc.synOK {
			if ret != tcActShot {
				t.Fatalf("%s: SYN verdict %d, want drop", tc.name, ret)
			}
			continue
		}
		if ret != tcActRedirect {
			t.Fatalf("%s: SYN verdict %d, want redirect", tc.name, ret)
		}
		f, ok := l7FlowOf(t, p, client, server)
		if !ok || !TieredSets(f.Sets) {
			t.Fatalf("%s: flow after the SYN %+v (found %v), want a tiered set: its requests go to user space", tc.name, f, ok)
		}
		// Port 81, which no rule covers: allowed, not inspected.
		other := netip.AddrPortFrom(podB, 81)
		syn = tcpFrame(hostMAC, podMAC, podA, podB, client.Port()+100, other.Port(), 1, tcpSYN, nil)
		if ret, _ := run(t, p.FromContainer, syn, ifA); ret != tcActRedirect {
			t.Fatalf("%s: SYN to 81: verdict %d, want redirect", tc.name, ret)
		}
		if f, ok := l7FlowOf(t, p, netip.AddrPortFrom(podA, client.Port()+100), other); ok {
			t.Fatalf("%s: a flow to port 81 is inspected: %+v", tc.name, f)
		}
	}
	loadPolicy(t, n, c, prev, &policy.Snapshot{})
}

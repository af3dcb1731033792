package policy

import (
	"errors"
	"net/netip"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"
)

// cnp is a cluster policy selecting namespace x's pods with app=a.
func cnp(kind, name string, tier npav1alpha2.Tier, priority int32, rules ...npav1alpha2.ClusterNetworkPolicyIngressRule) *ClusterPolicy {
	p := &ClusterPolicy{Kind: kind, Name: name}
	p.Spec.Tier, p.Spec.Priority = tier, priority
	p.Spec.Subject.Pods = &npav1alpha2.NamespacedPod{
		NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "x"}},
		PodSelector:       metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}}}
	p.Spec.Ingress = rules
	return p
}

// fromNS is an ingress rule with action for every pod of namespace ns,
// on TCP port (0: every protocol and port).
func fromNS(action, ns string, port int32) npav1alpha2.ClusterNetworkPolicyIngressRule {
	r := npav1alpha2.ClusterNetworkPolicyIngressRule{
		Action: npav1alpha2.ClusterNetworkPolicyRuleAction(action),
		From: []npav1alpha2.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{
			MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}}},
	}
	if port != 0 {
		r.Protocols = []npav1alpha2.ClusterNetworkPolicyProtocol{{TCP: &npav1alpha2.ClusterNetworkPolicyProtocolTCP{
			DestinationPort: &npav1alpha2.Port{Number: port}}}}
	}
	return r
}

// TestClusterPrecedence walks the precedence order one case at a time:
// what decides, and which rule the decision names.
func TestClusterPrecedence(t *testing.T) {
	allowY := np("x", "allow-y", map[string]string{"app": "a"}, []string{"Ingress"}, func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{nsPeer(map[string]string{"team": "red"})}}}
	})
	const up, weir = KindClusterNetworkPolicy, KindWeirClusterNetworkPolicy
	admin, baseline := npav1alpha2.AdminTier, npav1alpha2.BaselineTier
	tests := []struct {
		name    string
		nps     []*networkingv1.NetworkPolicy
		cps     []*ClusterPolicy
		verdict Verdict
		stage   Stage
		decider string // policy name of the deciding rule
		logged  string
	}{
		{"admin deny beats a NetworkPolicy allow", []*networkingv1.NetworkPolicy{allowY},
			[]*ClusterPolicy{cnp(up, "deny-y", admin, 10, fromNS("Deny", "y", 0))}, VerdictDeny, StageAdmin, "deny-y", ""},
		{"admin pass hands over to NetworkPolicy", []*networkingv1.NetworkPolicy{allowY},
			[]*ClusterPolicy{cnp(up, "pass-y", admin, 1, fromNS("Pass", "y", 80)), cnp(up, "deny-y", admin, 10, fromNS("Deny", "y", 0))},
			VerdictAllow, StageNetworkPolicy, "allow-y", ""},
		{"lower priority number first", nil,
			[]*ClusterPolicy{cnp(up, "deny", admin, 20, fromNS("Deny", "y", 0)), cnp(up, "accept", admin, 5, fromNS("Accept", "y", 80))},
			VerdictAllow, StageAdmin, "accept", ""},
		{"equal priority: upstream kind before Weir's", nil,
			[]*ClusterPolicy{cnp(weir, "a-weir", admin, 5, fromNS("Reject", "y", 0)), cnp(up, "z-up", admin, 5, fromNS("Deny", "y", 0))},
			VerdictDeny, StageAdmin, "z-up", ""},
		{"equal priority and kind: by name", nil,
			[]*ClusterPolicy{cnp(weir, "b", admin, 5, fromNS("Accept", "y", 0)), cnp(weir, "a", admin, 5, fromNS("Reject", "y", 0))},
			VerdictReject, StageAdmin, "a", ""},
		{"NetworkPolicy selecting the pod hides the baseline", []*networkingv1.NetworkPolicy{allowY},
			[]*ClusterPolicy{cnp(up, "base-deny", baseline, 0, fromNS("Deny", "y", 0))}, VerdictAllow, StageNetworkPolicy, "allow-y", ""},
		{"baseline decides what no NetworkPolicy selects", nil,
			[]*ClusterPolicy{cnp(up, "base-deny", baseline, 0, fromNS("Deny", "y", 0))}, VerdictDeny, StageBaseline, "base-deny", ""},
		{"log goes on to the next rule", nil,
			[]*ClusterPolicy{cnp(weir, "audit", admin, 0, fromNS("Log", "y", 0)), cnp(up, "deny", admin, 9, fromNS("Deny", "y", 80))},
			VerdictDeny, StageAdmin, "deny", "audit"},
		{"log after the decision is not reached", nil,
			[]*ClusterPolicy{cnp(weir, "audit", admin, 9, fromNS("Log", "y", 0)), cnp(up, "accept", admin, 0, fromNS("Accept", "y", 80))},
			VerdictAllow, StageAdmin, "accept", ""},
		{"a port rule that does not match leaves the default", nil,
			[]*ClusterPolicy{cnp(up, "deny-81", admin, 0, fromNS("Deny", "y", 81))}, VerdictAllow, StageDefault, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := fixture(tt.nps...)
			s.ClusterPolicies = tt.cps
			res := NewCompiler().Compile(s)
			if len(res.Errors) > 0 {
				t.Fatalf("errors: %v", res.Errors)
			}
			d := res.Lookup("x/a", Ingress, netip.MustParseAddr("10.0.1.1"), ProtoTCP, 80)
			if d.Verdict != tt.verdict || d.Stage != tt.stage || res.Rules[d.Rule].Name != tt.decider || res.Rules[d.Log].Name != tt.logged {
				t.Fatalf("decision %s at %s by %q logged by %q; want %s at %s by %q logged by %q", d.Verdict, d.Stage,
					res.Rules[d.Rule].Name, res.Rules[d.Log].Name, tt.verdict, tt.stage, tt.decider, tt.logged)
			}
		})
	}
}

// TestClusterRuleFailsClosed: a rule the compiler cannot read matches
// nothing when it would accept, and denies everything when it would deny
// or pass, as the API asks; the error names the rule.
func TestClusterRuleFailsClosed(t *testing.T) {
	domains := func(action string) *ClusterPolicy {
		p := cnp(KindClusterNetworkPolicy, "domains-"+action, npav1alpha2.AdminTier, 0)
		p.Spec.Subject = npav1alpha2.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}}
		p.Spec.Egress = []npav1alpha2.ClusterNetworkPolicyEgressRule{{
			Action: npav1alpha2.ClusterNetworkPolicyRuleAction(action),
			To:     []npav1alpha2.ClusterNetworkPolicyEgressPeer{{DomainNames: []npav1alpha2.DomainName{"example.com"}}}}}
		return p
	}
	for action, wantAllowed := range map[string]bool{"Accept": true, "Pass": false, "Deny": false} {
		s := fixture()
		s.ClusterPolicies = []*ClusterPolicy{domains(action)}
		res := NewCompiler().Compile(s)
		if len(res.Errors) != 1 || !errors.Is(res.Errors[0], errUnsupportedPeer) {
			t.Fatalf("%s: errors %v, want one unsupported peer", action, res.Errors)
		}
		d := res.Lookup("x/a", Egress, netip.MustParseAddr("10.0.2.1"), ProtoTCP, 443)
		if d.Allowed() != wantAllowed {
			t.Errorf("%s rule with an unsupported peer: %+v, want allowed=%v", action, d, wantAllowed)
		}
	}
	s := fixture()
	bad := cnp(KindClusterNetworkPolicy, "reject", npav1alpha2.AdminTier, 0, fromNS("Reject", "y", 0))
	s.ClusterPolicies = []*ClusterPolicy{bad}
	res := NewCompiler().Compile(s)
	if len(res.Errors) != 1 || !errors.Is(res.Errors[0], ErrInvalidPolicy) {
		t.Fatalf("Reject in the upstream kind: errors %v, want ErrInvalidPolicy", res.Errors)
	}
	if d := res.Lookup("x/a", Ingress, netip.MustParseAddr("10.0.3.1"), ProtoUDP, 53); d.Verdict != VerdictDeny {
		t.Fatalf("an unknown action must deny all, got %+v", d)
	}
}

// TestClusterNodesPeerOwnNode: a nodes peer that selects the pod's own
// node matches its address, which the ipcache knows as the host identity,
// not as a remote node; and egress to the own node has no exemption, so
// whatever the peer does not reach stays under NetworkPolicy.
func TestClusterNodesPeerOwnNode(t *testing.T) {
	toNodes := func(name string, tier npav1alpha2.Tier, action string, nodes map[string]string) *ClusterPolicy {
		p := cnp(KindClusterNetworkPolicy, name, tier, 0)
		p.Spec.Egress = []npav1alpha2.ClusterNetworkPolicyEgressRule{{
			Action: npav1alpha2.ClusterNetworkPolicyRuleAction(action),
			To:     []npav1alpha2.ClusterNetworkPolicyEgressPeer{{Nodes: &metav1.LabelSelector{MatchLabels: nodes}}},
			Protocols: []npav1alpha2.ClusterNetworkPolicyProtocol{{TCP: &npav1alpha2.ClusterNetworkPolicyProtocolTCP{
				DestinationPort: &npav1alpha2.Port{Number: 10250}}}},
		}}
		return p
	}
	denyEgress := np("x", "deny-egress", nil, []string{"Egress"}, nil)
	own, other := map[string]string{"kubernetes.io/hostname": "n1"}, map[string]string{"kubernetes.io/hostname": "n2"}
	admin, baseline := npav1alpha2.AdminTier, npav1alpha2.BaselineTier
	type want struct {
		verdict Verdict
		stage   Stage
		decider string
	}
	tests := []struct {
		name        string
		nps         []*networkingv1.NetworkPolicy
		cp          *ClusterPolicy
		host, other want // egress to the own node and to the other node
	}{
		{"admin deny of the own node", nil, toNodes("deny-own", admin, "Deny", own),
			want{VerdictDeny, StageAdmin, "deny-own"}, want{VerdictAllow, StageDefault, ""}},
		{"admin accept of the own node beats an egress default deny", []*networkingv1.NetworkPolicy{denyEgress},
			toNodes("accept-own", admin, "Accept", own),
			want{VerdictAllow, StageAdmin, "accept-own"}, want{VerdictDeny, StageNetworkPolicyDefaultDeny, ""}},
		{"admin accept of every node", []*networkingv1.NetworkPolicy{denyEgress}, toNodes("accept-all", admin, "Accept", nil),
			want{VerdictAllow, StageAdmin, "accept-all"}, want{VerdictAllow, StageAdmin, "accept-all"}},
		{"accepting the other node leaves the own node to NetworkPolicy", []*networkingv1.NetworkPolicy{denyEgress},
			toNodes("accept-other", admin, "Accept", other),
			want{VerdictDeny, StageNetworkPolicyDefaultDeny, ""}, want{VerdictAllow, StageAdmin, "accept-other"}},
		{"a baseline accept of the own node does not reach past a NetworkPolicy", []*networkingv1.NetworkPolicy{denyEgress},
			toNodes("base-accept-own", baseline, "Accept", own),
			want{VerdictDeny, StageNetworkPolicyDefaultDeny, ""}, want{VerdictDeny, StageNetworkPolicyDefaultDeny, ""}},
	}
	hostIP, otherIP := netip.MustParseAddr("192.168.0.1"), netip.MustParseAddr("192.168.0.2")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := fixture(tt.nps...)
			s.Nodes = []Node{
				{Name: "n1", Labels: own, IPs: s.HostIPs},
				{Name: "n2", Labels: other, IPs: s.RemoteNodeIPs},
			}
			s.ClusterPolicies = []*ClusterPolicy{tt.cp}
			res := NewCompiler().Compile(s)
			if len(res.Errors) > 0 {
				t.Fatalf("errors: %v", res.Errors)
			}
			if label, _ := res.PeerIdentities(hostIP); label != IdentityHost {
				t.Fatalf("own node's address has label identity %d, want host", label)
			}
			var pod *Pod
			for i := range s.Pods {
				if s.Pods[i].Key() == "x/a" {
					pod = &s.Pods[i]
				}
			}
			check := func(peer netip.Addr, port uint16, w want) {
				t.Helper()
				d := res.Lookup("x/a", Egress, peer, ProtoTCP, port)
				if d.Verdict != w.verdict || d.Stage != w.stage || res.Rules[d.Rule].Name != w.decider {
					t.Errorf("egress to %s:%d: %s at %s by %q, want %s at %s by %q", peer, port,
						d.Verdict, d.Stage, res.Rules[d.Rule].Name, w.verdict, w.stage, w.decider)
				}
				if err := sameDecision(res, d, Evaluate(s, pod, Egress, peer, ProtoTCP, port)); err != nil {
					t.Errorf("egress to %s:%d: %v", peer, port, err)
				}
			}
			// The rule names port 10250; other ports of either node get
			// what no cluster rule decides.
			rest := want{VerdictAllow, StageDefault, ""}
			if len(tt.nps) > 0 {
				rest = want{VerdictDeny, StageNetworkPolicyDefaultDeny, ""}
			}
			check(hostIP, 10250, tt.host)
			check(otherIP, 10250, tt.other)
			check(hostIP, 9880, rest)
			check(otherIP, 9880, rest)
		})
	}
}

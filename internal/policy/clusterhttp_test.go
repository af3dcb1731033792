package policy

import (
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/weirnet/weir/internal/l7"
)

// l7ClusterRule is an ingress rule of a WeirClusterNetworkPolicy
// selecting app=web, from app=client on TCP port 80, with HTTP rules
// (none: an L4 rule).
type l7ClusterRule struct {
	action string
	http   []l7.Rule
}

func l7ClusterPolicy(name string, tier npav1alpha2.Tier, priority int32, rules ...l7ClusterRule) *ClusterPolicy {
	p := &ClusterPolicy{Kind: KindWeirClusterNetworkPolicy, Name: name, HTTP: &ClusterHTTP{}}
	p.Spec.Tier, p.Spec.Priority = tier, priority
	p.Spec.Subject.Pods = &npav1alpha2.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}
	for _, r := range rules {
		p.Spec.Ingress = append(p.Spec.Ingress, npav1alpha2.ClusterNetworkPolicyIngressRule{
			Action: npav1alpha2.ClusterNetworkPolicyRuleAction(r.action),
			From: []npav1alpha2.ClusterNetworkPolicyIngressPeer{{Pods: &npav1alpha2.NamespacedPod{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}}},
			Protocols: []npav1alpha2.ClusterNetworkPolicyProtocol{{TCP: &npav1alpha2.ClusterNetworkPolicyProtocolTCP{
				DestinationPort: &npav1alpha2.Port{Number: 80}}}},
		})
		p.HTTP.Ingress = append(p.HTTP.Ingress, r.http)
	}
	return p
}

// TestClusterHTTPRules reads the tiers' HTTP rules as an operator would:
// a conditional rule decides the requests its HTTP rules match, in its
// place in the precedence order, and every other request goes on.
func TestClusterHTTPRules(t *testing.T) {
	exhaust := l7.Rule{Method: "PUT", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/v1/exhaust-port"}}
	health := l7.Rule{Method: "GET", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/healthz"}}
	landing := l7.Rule{Method: "POST", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/v1/request-landing"}}
	deathstar, deathstarHTTP := l7Policy("deathstar", landing)
	admin, baseline := npav1alpha2.AdminTier, npav1alpha2.BaselineTier
	type probe struct {
		method, path string
		allowed      bool
		stage        Stage
		action       Action // of the deciding cluster rule; 0 for none
	}
	for _, tc := range []struct {
		name    string
		np      bool // the deathstar WeirNetworkPolicy selects web too
		cluster []*ClusterPolicy
		conn    Decision
		probes  []probe
	}{{
		name:    "an Admin Deny of one request: the rest go on to the default",
		cluster: []*ClusterPolicy{l7ClusterPolicy("no-exhaust", admin, 10, l7ClusterRule{"Deny", []l7.Rule{exhaust}})},
		conn:    Decision{Verdict: VerdictAllow, Stage: StageDefault, Inspect: true},
		probes: []probe{
			{"PUT", "/v1/exhaust-port", false, StageAdmin, ActionDeny},
			{"GET", "/v1/exhaust-port", true, StageDefault, 0},
		},
	}, {
		name: "an Admin Accept of one request before an Admin Deny of all: the connection is let on",
		cluster: []*ClusterPolicy{l7ClusterPolicy("health-only", admin, 10,
			l7ClusterRule{"Accept", []l7.Rule{health}}, l7ClusterRule{"Deny", nil})},
		conn: Decision{Verdict: VerdictAllow, Stage: StageAdmin, Inspect: true},
		probes: []probe{
			{"GET", "/healthz", true, StageAdmin, ActionAccept},
			{"GET", "/", false, StageAdmin, ActionDeny},
		},
	}, {
		name: "an Admin Deny of all before a conditional Accept: the Accept is never reached",
		cluster: []*ClusterPolicy{l7ClusterPolicy("deny-first", admin, 10,
			l7ClusterRule{"Deny", nil}, l7ClusterRule{"Accept", []l7.Rule{health}})},
		conn: Decision{Verdict: VerdictDeny, Stage: StageAdmin},
	}, {
		name: "an Admin Accept of one request skips NetworkPolicy, which judges the rest",
		np:   true,
		cluster: []*ClusterPolicy{l7ClusterPolicy("health", admin, 10,
			l7ClusterRule{"Accept", []l7.Rule{health}})},
		conn: Decision{Verdict: VerdictAllow, Stage: StageAdmin, Inspect: true},
		probes: []probe{
			{"GET", "/healthz", true, StageAdmin, ActionAccept},
			{"POST", "/v1/request-landing", true, StageNetworkPolicy, 0},
			{"PUT", "/v1/exhaust-port", false, StageNetworkPolicyDefaultDeny, 0},
		},
	}, {
		name: "a Pass of one request before an Admin Deny of all: NetworkPolicy judges it",
		np:   true,
		cluster: []*ClusterPolicy{l7ClusterPolicy("pass-landing", admin, 10,
			l7ClusterRule{"Pass", []l7.Rule{landing, exhaust}}, l7ClusterRule{"Deny", nil})},
		conn: Decision{Verdict: VerdictAllow, Stage: StageAdmin, Inspect: true},
		probes: []probe{
			{"POST", "/v1/request-landing", true, StageNetworkPolicy, 0},
			{"PUT", "/v1/exhaust-port", false, StageNetworkPolicyDefaultDeny, 0},
			{"GET", "/healthz", false, StageAdmin, ActionDeny},
		},
	}, {
		name: "a Baseline Deny of one request where no NetworkPolicy selects the pod",
		cluster: []*ClusterPolicy{l7ClusterPolicy("baseline", baseline, 10,
			l7ClusterRule{"Reject", []l7.Rule{exhaust}})},
		conn: Decision{Verdict: VerdictAllow, Stage: StageDefault, Inspect: true},
		probes: []probe{
			{"PUT", "/v1/exhaust-port", false, StageBaseline, ActionReject},
			{"POST", "/v1/request-landing", true, StageDefault, 0},
		},
	}, {
		name: "a Baseline rule is not reached where a NetworkPolicy selects the pod",
		np:   true,
		cluster: []*ClusterPolicy{l7ClusterPolicy("baseline", baseline, 10,
			l7ClusterRule{"Accept", []l7.Rule{exhaust}})},
		conn: Decision{Verdict: VerdictAllow, Stage: StageNetworkPolicy},
		probes: []probe{
			{"PUT", "/v1/exhaust-port", false, StageNetworkPolicyDefaultDeny, 0},
			{"POST", "/v1/request-landing", true, StageNetworkPolicy, 0},
		},
	}, {
		name: "priorities order conditional rules across policies",
		cluster: []*ClusterPolicy{
			l7ClusterPolicy("later", admin, 20, l7ClusterRule{"Accept", []l7.Rule{{Method: "PUT"}}}),
			l7ClusterPolicy("first", admin, 10, l7ClusterRule{"Deny", []l7.Rule{exhaust}}),
		},
		conn: Decision{Verdict: VerdictAllow, Stage: StageAdmin, Inspect: true},
		probes: []probe{
			{"PUT", "/v1/exhaust-port", false, StageAdmin, ActionDeny},
			{"PUT", "/v1/other", true, StageAdmin, ActionAccept},
			{"GET", "/", true, StageDefault, 0},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := l7Cluster()
			if tc.np {
				s = l7Cluster(deathstar, deathstarHTTP)
			}
			s.ClusterPolicies = tc.cluster
			res := NewCompiler().Compile(s)
			if len(res.Errors) > 0 {
				t.Fatal(res.Errors)
			}
			conn := res.Lookup("default/web", Ingress, l7Client, ProtoTCP, 80)
			if conn.Verdict != tc.conn.Verdict || conn.Stage != tc.conn.Stage || conn.Inspect != tc.conn.Inspect {
				t.Fatalf("connection %s at %s inspect %v, want %s at %s inspect %v",
					conn.Verdict, conn.Stage, conn.Inspect, tc.conn.Verdict, tc.conn.Stage, tc.conn.Inspect)
			}
			if other := res.Lookup("default/web", Ingress, l7Other, ProtoTCP, 80); other.Inspect {
				t.Errorf("a peer no conditional rule names is inspected: %+v", other)
			}
			if udp := res.Lookup("default/web", Ingress, l7Client, ProtoUDP, 80); udp.Inspect {
				t.Errorf("UDP to the port is inspected: %+v", udp)
			}
			for _, p := range tc.probes {
				req := httpReq(t, p.method, p.path)
				got, err := res.LookupHTTP("default/web", Ingress, l7Client, 80, req)
				if err != nil {
					t.Fatal(err)
				}
				want, err := EvaluateHTTP(s, &s.Pods[0], Ingress, l7Client, 80, req)
				if err != nil {
					t.Fatal(err)
				}
				where := p.method + " " + p.path
				if got.Allowed != p.allowed || got.Request.Stage != p.stage || !got.Restricted {
					t.Errorf("%s: allowed %v at %s restricted %v, want %v at %s", where, got.Allowed, got.Request.Stage, got.Restricted, p.allowed, p.stage)
				}
				if err := kernelWalkAgrees(res, "default/web", Ingress, l7Client, 80, req, got); err != nil {
					t.Errorf("%s: %v", where, err)
				}
				if want.Allowed != got.Allowed || want.Request.Stage != got.Request.Stage {
					t.Errorf("%s: EvaluateHTTP says allowed %v at %s", where, want.Allowed, want.Request.Stage)
				}
				if p.action != 0 && res.Rules[got.Request.Rule].Action != p.action {
					t.Errorf("%s: decided by %v, want a %s rule", where, res.Rules[got.Request.Rule], p.action)
				}
			}
		})
	}
}

// TestClusterHTTPRefused: HTTP rules a cluster rule cannot carry refuse
// the rule with the policy's error, and the rule fails closed as any
// rule Weir cannot read: an Accept matches nothing, a Deny denies all.
func TestClusterHTTPRefused(t *testing.T) {
	get := []l7.Rule{{Method: "GET"}}
	tcp := func(p npav1alpha2.Port) []npav1alpha2.ClusterNetworkPolicyProtocol {
		return []npav1alpha2.ClusterNetworkPolicyProtocol{{TCP: &npav1alpha2.ClusterNetworkPolicyProtocolTCP{DestinationPort: &p}}}
	}
	for _, tc := range []struct {
		name   string
		edit   func(p *ClusterPolicy)
		reason string
	}{
		{"the upstream kind", func(p *ClusterPolicy) { p.Kind = KindClusterNetworkPolicy },
			"only in WeirClusterNetworkPolicy"},
		{"no protocols", func(p *ClusterPolicy) { p.Spec.Ingress[0].Protocols = nil }, "without protocols"},
		{"a port range", func(p *ClusterPolicy) {
			p.Spec.Ingress[0].Protocols = tcp(npav1alpha2.Port{Range: &npav1alpha2.PortRange{Start: 80, End: 81}})
		}, "one TCP port by number"},
		{"every TCP port", func(p *ClusterPolicy) {
			p.Spec.Ingress[0].Protocols = []npav1alpha2.ClusterNetworkPolicyProtocol{{TCP: &npav1alpha2.ClusterNetworkPolicyProtocolTCP{}}}
		}, "one TCP port by number"},
		{"a named port", func(p *ClusterPolicy) {
			p.Spec.Ingress[0].Protocols = []npav1alpha2.ClusterNetworkPolicyProtocol{{DestinationNamedPort: "http"}}
		}, "one TCP port by number"},
		{"UDP", func(p *ClusterPolicy) {
			p.Spec.Ingress[0].Protocols = []npav1alpha2.ClusterNetworkPolicyProtocol{{UDP: &npav1alpha2.ClusterNetworkPolicyProtocolUDP{
				DestinationPort: &npav1alpha2.Port{Number: 80}}}}
		}, "one TCP port by number"},
		{"a rule the matcher refuses", func(p *ClusterPolicy) {
			p.HTTP.Ingress[0] = []l7.Rule{{Path: &l7.PathMatch{Type: l7.PathExact, Value: "no-slash"}}}
		}, "path"},
	} {
		for _, action := range []string{"Accept", "Deny"} {
			t.Run(tc.name+" "+action, func(t *testing.T) {
				p := l7ClusterPolicy("bad", npav1alpha2.AdminTier, 10, l7ClusterRule{action, get})
				tc.edit(p)
				s := l7Cluster()
				s.ClusterPolicies = []*ClusterPolicy{p}
				res := NewCompiler().Compile(s)
				if len(res.Errors) != 1 || !errors.Is(res.Errors[0], ErrInvalidPolicy) || !strings.Contains(res.Errors[0].Error(), tc.reason) {
					t.Fatalf("errors %v, want one naming %q", res.Errors, tc.reason)
				}
				d := res.Lookup("default/web", Ingress, l7Client, ProtoTCP, 80)
				if d.Inspect {
					t.Errorf("a refused rule inspects: %+v", d)
				}
				switch p.Spec.Ingress[0].Action {
				case "Accept":
					if !d.Allowed() || d.Stage != StageDefault {
						t.Errorf("a refused Accept: %+v, want it to match nothing", d)
					}
				default:
					if o := res.Lookup("default/web", Ingress, l7Other, ProtoUDP, 53); d.Allowed() || o.Allowed() {
						t.Errorf("a refused Deny: %+v, UDP from another pod %+v, want both denied", d, o)
					}
				}
			})
		}
	}
}

// TestAddIngressKeepsRulesInStep: HTTP rules stay at their rule's index,
// also after rules set on Spec directly.
func TestAddIngressKeepsRulesInStep(t *testing.T) {
	p := &ClusterPolicy{Kind: KindWeirClusterNetworkPolicy, Name: "p"}
	p.Spec.Ingress = []npav1alpha2.ClusterNetworkPolicyIngressRule{{Name: "l4", Action: "Deny"}}
	put := []l7.Rule{{Method: "PUT"}}
	p.AddIngress(npav1alpha2.ClusterNetworkPolicyIngressRule{Name: "put", Action: "Deny"}, put)
	p.AddIngress(npav1alpha2.ClusterNetworkPolicyIngressRule{Name: "rest", Action: "Accept"}, nil)
	if len(p.Spec.Ingress) != 3 || len(p.HTTP.Ingress) != 3 || p.HTTP.Ingress[0] != nil || p.HTTP.Ingress[2] != nil ||
		p.HTTP.rules(Ingress, 1)[0].Method != "PUT" || p.Spec.Ingress[1].Name != "put" {
		t.Fatalf("rules %+v, HTTP %+v", p.Spec.Ingress, p.HTTP.Ingress)
	}
}

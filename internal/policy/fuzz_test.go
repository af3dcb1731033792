package policy

import (
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// malformedSeeds are NetworkPolicy and ClusterNetworkPolicy spec documents
// the API server's validation would refuse, or that only a webhook-less
// cluster lets through: the compiler must read them without panicking and
// fail their subjects closed.
var malformedSeeds = [][2]string{
	{`{"metadata":{"namespace":"x","name":"ok"},"spec":{"podSelector":{"matchLabels":{"app":"a"}},"ingress":[{"ports":[{"port":80}]}]}}`,
		`{"tier":"Admin","priority":1,"subject":{"namespaces":{}},"ingress":[{"action":"Deny","from":[{"namespaces":{}}]}]}`},
	{`{"metadata":{"namespace":"x","name":"bad-op"},"spec":{"podSelector":{"matchExpressions":[{"key":"app","operator":"Nope","values":["a"]}]}}}`,
		`{"tier":"Admin","priority":-5,"subject":{"pods":{"namespaceSelector":{"matchExpressions":[{"key":"k","operator":"In"}]},"podSelector":{}}}}`},
	{`{"metadata":{"namespace":"x","name":"bad-type"},"spec":{"podSelector":{},"policyTypes":["Sideways"]}}`,
		`{"tier":"Nowhere","priority":1,"subject":{},"egress":[{"action":"Explode","to":[{"networks":["10.0.0.0/33"]}]}]}`},
	{`{"metadata":{"namespace":"x","name":"bad-cidr"},"spec":{"podSelector":{},"egress":[{"to":[{"ipBlock":{"cidr":"10.0.0.0/33","except":["192.168.0.0/16","nonsense"]}}]}],"policyTypes":["Egress"]}}`,
		`{"tier":"Baseline","priority":1,"subject":{"namespaces":{}},"egress":[{"action":"Accept","to":[{"nodes":{"matchExpressions":[{"key":"a","operator":"Exists","values":["x"]}]}}],"protocols":[{"tcp":{"destinationPort":{"range":{"start":90,"end":80}}}}]}]}`},
	{`{"metadata":{"namespace":"x","name":"bad-ports"},"spec":{"podSelector":{},"ingress":[{"ports":[{"port":0},{"port":70000},{"port":"","endPort":5},{"protocol":"ICMP","port":1},{"port":90,"endPort":80}]}]}}`,
		`{"tier":"Admin","priority":1,"subject":{"namespaces":{}},"ingress":[{"action":"Accept","from":[{"pods":{"namespaceSelector":{},"podSelector":{}}}],"protocols":[{"udp":{"destinationPort":{"number":-1}}},{"destinationNamedPort":""}]}]}`},
	{`{"metadata":{"namespace":"x","name":"named"},"spec":{"podSelector":{},"egress":[{"ports":[{"port":"http"},{"port":"-bad name-"}]}]}}`, `{}`},
}

// FuzzCompileMalformed compiles one NetworkPolicy and one cluster policy
// decoded from arbitrary bytes into a small cluster. Whatever they hold,
// the compiler returns (no panic), every error names a policy of the
// snapshot, and a NetworkPolicy it reports broken leaves none of its
// subjects unenforced: a policy Weir cannot read fails closed, it is
// never ignored.
func FuzzCompileMalformed(f *testing.F) {
	for _, s := range malformedSeeds {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, npDoc, cnpDoc []byte) {
		var np networkingv1.NetworkPolicy
		if json.Unmarshal(npDoc, &np) != nil {
			return // not a NetworkPolicy at all: the API server holds only decodable objects
		}
		np.Namespace, np.Name = "x", "fuzz"
		cnp := &ClusterPolicy{Kind: KindClusterNetworkPolicy, Name: "fuzz"}
		if json.Unmarshal(cnpDoc, &cnp.Spec) != nil {
			cnp = nil
		}
		s := fixture(&np)
		if cnp != nil {
			s.ClusterPolicies = []*ClusterPolicy{cnp}
		}
		res := NewCompiler().Compile(s)

		npBroken := false
		for _, err := range res.Errors {
			var npe *NetworkPolicyError
			switch {
			case errors.As(err, &npe):
				if npe.Namespace != "x" || npe.Name != "fuzz" {
					t.Fatalf("error names a policy not in the snapshot: %v", err)
				}
				npBroken = true
			case !strings.Contains(err.Error(), "fuzz"):
				t.Fatalf("error names no policy: %v", err)
			}
		}
		if npBroken {
			sel, err := asSelector(&np.Spec.PodSelector)
			for _, pod := range s.Pods {
				if err != nil || !pod.Local || pod.Namespace != "x" || !sel.Matches(labels.Set(pod.Labels)) {
					continue
				}
				ep := res.Endpoints[pod.Key()]
				if ep == nil || (!ep.Enforced[Ingress] && !ep.Enforced[Egress]) {
					t.Fatalf("%s is a subject of a broken policy and is not enforced: %+v", pod.Key(), ep)
				}
			}
		}
		// Every lookup answers.
		for pod := range res.Endpoints {
			for _, d := range []Direction{Ingress, Egress} {
				res.Lookup(pod, d, netip.MustParseAddr("10.0.0.1"), ProtoTCP, 80)
			}
		}
	})
}

// TestMalformedSeedsFailClosed: the seeds the API server would refuse are
// reported as errors of their policy, so the fuzz target's fail-closed
// check has cases to hold from its first run.
func TestMalformedSeedsFailClosed(t *testing.T) {
	for _, seed := range malformedSeeds[1:5] {
		var np networkingv1.NetworkPolicy
		if err := json.Unmarshal([]byte(seed[0]), &np); err != nil {
			t.Fatal(err)
		}
		res := NewCompiler().Compile(fixture(&np))
		var npe *NetworkPolicyError
		if len(res.Errors) == 0 || !errors.As(res.Errors[0], &npe) {
			t.Errorf("%s: errors %v, want a NetworkPolicyError", np.Name, res.Errors)
		}
	}
}

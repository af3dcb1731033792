package k8s

import (
	"sort"

	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/weirnet/weir/internal/k8s/apis/weirv1alpha1"
	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/policy"
)

// ClusterPolicyResource is the upstream ClusterNetworkPolicy
// (deploy/crd-clusternetworkpolicies.yaml).
var ClusterPolicyResource = npav1alpha2.SchemeGroupVersion.WithResource("clusternetworkpolicies")

// WeirClusterPolicyResource is Weir's WeirClusterNetworkPolicy
// (deploy/crd-weirclusternetworkpolicies.yaml).
var WeirClusterPolicyResource = weirv1alpha1.Resource

// clusterPoliciesFrom converts the cached objects of both cluster kinds,
// sorted by kind, then name. Specs share their slices with the cache.
func clusterPoliciesFrom(upstream, weir []any) []*policy.ClusterPolicy {
	var out []*policy.ClusterPolicy
	for _, o := range upstream {
		if p, ok := o.(*npav1alpha2.ClusterNetworkPolicy); ok {
			out = append(out, &policy.ClusterPolicy{Kind: policy.KindClusterNetworkPolicy,
				Name: p.Name, Generation: p.Generation, Spec: p.Spec})
		}
	}
	for _, o := range weir {
		if p, ok := o.(*weirv1alpha1.WeirClusterNetworkPolicy); ok {
			out = append(out, &policy.ClusterPolicy{Kind: policy.KindWeirClusterNetworkPolicy,
				Name: p.Name, Generation: p.Generation, Spec: upstreamSpec(p.Spec), HTTP: clusterHTTP(p.Spec)})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// upstreamSpec puts a Weir spec in the upstream types. Only the action
// types differ, and the strings carry over: the compiler reads Reject and
// Log from the upstream Action field, knowing the policy's kind.
func upstreamSpec(s weirv1alpha1.WeirClusterNetworkPolicySpec) npav1alpha2.ClusterNetworkPolicySpec {
	out := npav1alpha2.ClusterNetworkPolicySpec{Tier: s.Tier, Priority: s.Priority, Subject: s.Subject}
	for _, r := range s.Ingress {
		out.Ingress = append(out.Ingress, npav1alpha2.ClusterNetworkPolicyIngressRule{
			Name: r.Name, Action: npav1alpha2.ClusterNetworkPolicyRuleAction(r.Action),
			From: r.From, Protocols: r.Protocols,
		})
	}
	for _, r := range s.Egress {
		out.Egress = append(out.Egress, npav1alpha2.ClusterNetworkPolicyEgressRule{
			Name: r.Name, Action: npav1alpha2.ClusterNetworkPolicyRuleAction(r.Action),
			To: r.To, Protocols: r.Protocols,
		})
	}
	return out
}

// clusterHTTP takes the HTTP rules off a Weir spec's rules, by rule; nil
// when no rule has any.
func clusterHTTP(s weirv1alpha1.WeirClusterNetworkPolicySpec) *policy.ClusterHTTP {
	var h policy.ClusterHTTP
	found := false
	rules := func(in []weirv1alpha1.HTTPRule) []l7.Rule {
		if len(in) == 0 {
			return nil
		}
		found = true
		out := make([]l7.Rule, len(in))
		for i, r := range in {
			out[i] = httpRule(r)
		}
		return out
	}
	for _, r := range s.Ingress {
		h.Ingress = append(h.Ingress, rules(r.HTTP))
	}
	for _, r := range s.Egress {
		h.Egress = append(h.Egress, rules(r.HTTP))
	}
	if !found {
		return nil
	}
	return &h
}

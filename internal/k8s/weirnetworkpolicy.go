package k8s

import (
	networkingv1 "k8s.io/api/networking/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weirnet/weir/internal/k8s/apis/weirv1alpha1"
	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/policy"
)

// WeirNetworkPolicyResource is Weir's namespaced WeirNetworkPolicy
// (deploy/crd-weirnetworkpolicies.yaml).
var WeirNetworkPolicyResource = weirv1alpha1.NetworkPolicyResource

// WeirNetworkPolicyToPolicy splits a WeirNetworkPolicy into what the
// policy compiler reads: the NetworkPolicy its selectors, peers and ports
// are (HTTP rules taken off), and its HTTP rules by rule and port
// (Snapshot.HTTP). Defaults the API server applies (a path match's
// PathPrefix "/", a header match's Exact) are applied here too, for
// objects that did not come through it. Whether the rules are valid is
// the compiler's to say, per rule, with the policy's name.
func WeirNetworkPolicyToPolicy(w *weirv1alpha1.WeirNetworkPolicy) (*networkingv1.NetworkPolicy, *policy.PolicyHTTP) {
	np := &networkingv1.NetworkPolicy{ObjectMeta: *w.ObjectMeta.DeepCopy()}
	np.Spec.PodSelector = *w.Spec.PodSelector.DeepCopy()
	np.Spec.PolicyTypes = append([]networkingv1.PolicyType(nil), w.Spec.PolicyTypes...)
	h := &policy.PolicyHTTP{}
	for _, r := range w.Spec.Ingress {
		ports, http := splitPorts(r.Ports)
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: peersCopy(r.From), Ports: ports})
		h.Ingress = append(h.Ingress, http)
	}
	for _, r := range w.Spec.Egress {
		ports, http := splitPorts(r.Ports)
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: peersCopy(r.To), Ports: ports})
		h.Egress = append(h.Egress, http)
	}
	return np, h
}

func peersCopy(peers []networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyPeer {
	if peers == nil {
		return nil
	}
	out := make([]networkingv1.NetworkPolicyPeer, len(peers))
	for i := range peers {
		peers[i].DeepCopyInto(&out[i])
	}
	return out
}

// splitPorts takes the HTTP rules off a rule's ports.
func splitPorts(ports []weirv1alpha1.WeirNetworkPolicyPort) ([]networkingv1.NetworkPolicyPort, [][]l7.Rule) {
	if ports == nil {
		return nil, nil
	}
	out := make([]networkingv1.NetworkPolicyPort, len(ports))
	http := make([][]l7.Rule, len(ports))
	for i, p := range ports {
		p.NetworkPolicyPort.DeepCopyInto(&out[i])
		for _, r := range p.HTTP {
			http[i] = append(http[i], httpRule(r))
		}
	}
	return out, http
}

// httpRule converts one HTTP rule to the matcher's.
func httpRule(r weirv1alpha1.HTTPRule) l7.Rule {
	var out l7.Rule
	if r.Method != nil {
		out.Method = string(*r.Method)
	}
	if r.Path != nil {
		typ, value := gatewayv1.PathMatchPathPrefix, "/"
		if r.Path.Type != nil {
			typ = *r.Path.Type
		}
		if r.Path.Value != nil {
			value = *r.Path.Value
		}
		out.Path = &l7.PathMatch{Type: l7.PathMatchType(typ), Value: value}
	}
	for _, h := range r.Hostnames {
		out.Hostnames = append(out.Hostnames, string(h))
	}
	for _, h := range r.Headers {
		typ := weirv1alpha1.HTTPHeaderMatchExact
		if h.Type != nil {
			typ = *h.Type
		}
		m := l7.HeaderMatch{Type: l7.HeaderMatchType(typ), Name: string(h.Name)}
		if h.Value != nil {
			m.Value = *h.Value
		}
		out.Headers = append(out.Headers, m)
	}
	return out
}

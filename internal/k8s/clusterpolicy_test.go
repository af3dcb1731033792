package k8s

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/weirnet/weir/internal/k8s/apis/weirv1alpha1"
	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/policy"
)

// TestWeirClusterPolicyHTTP: a WeirClusterNetworkPolicy's rules keep
// their HTTP rules through the conversion, by rule (nil for a rule
// without any), beside the upstream spec the compiler reads; a policy
// with none has no ClusterHTTP.
func TestWeirClusterPolicyHTTP(t *testing.T) {
	put := gatewayv1.HTTPMethod("PUT")
	exact := gatewayv1.PathMatchExact
	tcp80 := []npav1alpha2.ClusterNetworkPolicyProtocol{{TCP: &npav1alpha2.ClusterNetworkPolicyProtocolTCP{
		DestinationPort: &npav1alpha2.Port{Number: 80}}}}
	all := []npav1alpha2.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}}
	w := &weirv1alpha1.WeirClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "no-exhaust", Generation: 3}}
	w.Spec.Tier, w.Spec.Priority = npav1alpha2.AdminTier, 5
	w.Spec.Ingress = []weirv1alpha1.IngressRule{
		{Action: "Deny", From: all, Protocols: tcp80, HTTP: []weirv1alpha1.HTTPRule{
			{Method: &put, Path: &weirv1alpha1.HTTPPathMatch{Type: &exact, Value: ptr.To("/v1/exhaust-port")}}}},
		{Action: "Accept", From: all, Protocols: tcp80},
	}
	plain := &weirv1alpha1.WeirClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "plain"}}
	plain.Spec.Ingress = w.Spec.Ingress[1:]
	got := clusterPoliciesFrom(nil, []any{w, plain})
	if len(got) != 2 || got[0].Name != "no-exhaust" || got[1].Name != "plain" {
		t.Fatalf("converted %v", got)
	}
	want := &policy.ClusterHTTP{Ingress: [][]l7.Rule{
		{{Method: "PUT", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/v1/exhaust-port"}}}, nil}}
	if !reflect.DeepEqual(got[0].HTTP, want) {
		t.Fatalf("HTTP rules %+v, want %+v", got[0].HTTP, want)
	}
	if got[1].HTTP != nil {
		t.Fatalf("a policy without HTTP rules converted with %+v", got[1].HTTP)
	}
	if len(got[0].Spec.Ingress) != 2 || got[0].Spec.Ingress[0].Action != "Deny" {
		t.Fatalf("upstream spec %+v", got[0].Spec)
	}
}

package policy

import (
	"fmt"
	"net/netip"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// scaleSnapshot is the policy-scale benchmark's cluster in miniature:
// pods with 350 label sets, rules half port ranges on one selector, half
// /32 ipBlocks, all selecting one server pod.
func scaleSnapshot(pods, rules int) *Snapshot {
	s := &Snapshot{Namespaces: map[string]Namespace{"bench": {}, "virtual": {}}, Identities: map[string]Identity{}}
	next := Identity(256)
	add := func(p Pod) {
		key := IdentityLabels(s.namespace(p.Namespace), p.Labels).Key()
		if _, ok := s.Identities[key]; !ok {
			s.Identities[key] = next
			next++
		}
		s.Pods = append(s.Pods, p)
	}
	add(Pod{Namespace: "bench", Name: "server", Labels: map[string]string{"app": "server"}, IPs: []netip.Addr{netip.MustParseAddr("10.244.0.3")}, Local: true})
	add(Pod{Namespace: "bench", Name: "client", Labels: map[string]string{"app": "client"}, IPs: []netip.Addr{netip.MustParseAddr("10.244.0.4")}, Local: true})
	for i := 0; i < pods; i++ {
		add(Pod{Namespace: "virtual", Name: fmt.Sprintf("v-%d", i), Labels: map[string]string{"app": fmt.Sprintf("virt-%d", i%50), "shard": fmt.Sprintf("s%d", i%7)},
			IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, byte(2 + i/250), byte(2 + i%250)})}})
	}
	var ingress []networkingv1.NetworkPolicyIngressRule
	for i := 0; i < rules; i++ {
		port := intstr.FromInt32(int32(40000 + i))
		if i%2 == 0 {
			ingress = append(ingress, networkingv1.NetworkPolicyIngressRule{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port}}})
			continue
		}
		ingress = append(ingress, networkingv1.NetworkPolicyIngressRule{
			From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("172.16.%d.%d/32", i>>8, i&255)}}}})
	}
	for i := 0; i < len(ingress); i += 100 {
		s.Policies = append(s.Policies, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("p%d", i)},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
				Ingress: ingress[i:min(i+100, len(ingress))]}})
	}
	return s
}

// BenchmarkCompileScale is the compiler's share of a policy change at the
// policy-scale benchmark's 1,000 pods and 1,000 rules.
func BenchmarkCompileScale(b *testing.B) {
	s := scaleSnapshot(1000, 1000)
	c := NewCompiler()
	prev := c.Compile(s)
	b.ResetTimer()
	for b.Loop() {
		res := c.Compile(s)
		DiffResults(prev, res)
	}
}

package policy

import (
	"fmt"
	"github.com/weirnet/weir/internal/l7"
	"math/rand/v2"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"
)

// The generator builds small random clusters in the shape cyclonus uses:
// namespaces x, y, z with pods a, b, c, and policies drawn from every
// construct NetworkPolicy v1 has.

var (
	genNamespaces = []string{"x", "y", "z"}
	genPods       = []string{"a", "b", "c"}
	genHost       = netip.MustParseAddr("192.168.0.1")
	genRemoteNode = netip.MustParseAddr("192.168.0.2")
	genExternal   = netip.MustParseAddr("172.16.5.5")
)

func genPodIP(ns, pod int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 0, byte(ns + 1), byte(pod + 1)})
}

// genPorts are a pod's ports. "web" is 80 on some pods and 81 on others,
// even among pods with the same labels, as Deployments being rolled can be.
func genPorts(r *rand.Rand) []NamedPort {
	ports := []NamedPort{
		{Name: "serve-80-tcp", Port: 80, Protocol: ProtoTCP},
		{Name: "serve-81-udp", Port: 81, Protocol: ProtoUDP},
	}
	switch r.IntN(3) {
	case 0:
		ports = append(ports, NamedPort{Name: "web", Port: 80, Protocol: ProtoTCP})
	case 1:
		ports = append(ports, NamedPort{Name: "web", Port: 81, Protocol: ProtoTCP})
	}
	return ports
}

func genSnapshot(r *rand.Rand, policies int) *Snapshot {
	s := &Snapshot{
		Namespaces:    map[string]Namespace{},
		Identities:    map[string]Identity{},
		HostIPs:       []netip.Addr{genHost},
		RemoteNodeIPs: []netip.Addr{genRemoteNode},
	}
	for i, ns := range genNamespaces {
		s.Namespaces[ns] = Namespace{Name: ns, Labels: map[string]string{
			"ns": ns, "kubernetes.io/metadata.name": ns, "tier": fmt.Sprint(i % 2)}}
		for j, pod := range genPods {
			labels := map[string]string{"pod": pod}
			if r.IntN(3) == 0 {
				labels["app"] = "web"
			}
			if r.IntN(4) == 0 { // two pods with one label set
				labels = map[string]string{"app": "web"}
			}
			s.Pods = append(s.Pods, Pod{
				Namespace: ns, Name: pod, Labels: labels,
				IPs:   []netip.Addr{genPodIP(i, j)},
				Ports: genPorts(r),
				Local: r.IntN(4) != 0,
			})
		}
	}
	for _, p := range s.Pods {
		key := IdentityLabels(s.namespace(p.Namespace), p.Labels).Key()
		if _, ok := s.Identities[key]; !ok {
			s.Identities[key] = MinClusterIdentity + Identity(len(s.Identities))
		}
	}
	for i := 0; i < policies; i++ {
		s.Policies = append(s.Policies, genPolicy(r, fmt.Sprintf("p%d", i)))
	}
	return s
}

func genSelector(r *rand.Rand, key string, values []string) *metav1.LabelSelector {
	switch r.IntN(4) {
	case 0:
		return &metav1.LabelSelector{}
	case 1:
		return &metav1.LabelSelector{MatchLabels: map[string]string{key: values[r.IntN(len(values))]}}
	case 2:
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
			Key: key, Operator: metav1.LabelSelectorOpIn,
			Values: []string{values[r.IntN(len(values))], values[r.IntN(len(values))]}}}}
	default:
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
			Key: "app", Operator: metav1.LabelSelectorOpExists}}}
	}
}

func genPeer(r *rand.Rand) networkingv1.NetworkPolicyPeer {
	switch r.IntN(5) {
	case 0:
		return networkingv1.NetworkPolicyPeer{PodSelector: genSelector(r, "pod", genPods)}
	case 1:
		return networkingv1.NetworkPolicyPeer{NamespaceSelector: genSelector(r, "ns", genNamespaces)}
	case 2:
		return networkingv1.NetworkPolicyPeer{
			PodSelector:       genSelector(r, "pod", genPods),
			NamespaceSelector: genSelector(r, "ns", genNamespaces)}
	case 3:
		blocks := []networkingv1.IPBlock{
			{CIDR: "10.0.0.0/16", Except: []string{"10.0.1.0/24"}},
			{CIDR: "10.0.1.0/24", Except: []string{genPodIP(0, 1).String() + "/32"}},
			{CIDR: genPodIP(1, 2).String() + "/32"},
			{CIDR: "0.0.0.0/0", Except: []string{"10.0.0.0/8"}},
			{CIDR: "172.16.0.0/12"},
		}
		b := blocks[r.IntN(len(blocks))]
		return networkingv1.NetworkPolicyPeer{IPBlock: &b}
	default:
		return networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{
			MatchLabels: map[string]string{"tier": "1"}}}
	}
}

func protoPtr(p corev1.Protocol) *corev1.Protocol { return &p }

func genPort(r *rand.Rand) networkingv1.NetworkPolicyPort {
	intPort := func(n int) *intstr.IntOrString { v := intstr.FromInt32(int32(n)); return &v }
	switch r.IntN(7) {
	case 0:
		return networkingv1.NetworkPolicyPort{Port: intPort(80)}
	case 1:
		return networkingv1.NetworkPolicyPort{Protocol: protoPtr(corev1.ProtocolUDP), Port: intPort(81)}
	case 2:
		v := intstr.FromString([]string{"serve-80-tcp", "serve-81-udp", "web"}[r.IntN(3)])
		proto := corev1.ProtocolTCP
		if v.StrVal == "serve-81-udp" {
			proto = corev1.ProtocolUDP
		}
		return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &v}
	case 3:
		end := int32(81)
		return networkingv1.NetworkPolicyPort{Port: intPort(79), EndPort: &end}
	case 4:
		return networkingv1.NetworkPolicyPort{Protocol: protoPtr(corev1.ProtocolUDP)}
	case 5:
		return networkingv1.NetworkPolicyPort{Protocol: protoPtr(corev1.ProtocolSCTP), Port: intPort(80)}
	default:
		end := int32(1023)
		return networkingv1.NetworkPolicyPort{Protocol: protoPtr(corev1.ProtocolTCP), Port: intPort(81), EndPort: &end}
	}
}

func genPolicy(r *rand.Rand, name string) *networkingv1.NetworkPolicy {
	p := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{
		Namespace: genNamespaces[r.IntN(len(genNamespaces))], Name: name}}
	p.Spec.PodSelector = *genSelector(r, "pod", genPods)
	switch r.IntN(4) {
	case 0: // policyTypes absent: ingress, plus egress if it has egress rules
	case 1:
		p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	case 2:
		p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	default:
		p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	}
	for i := r.IntN(3); i > 0; i-- {
		var rule networkingv1.NetworkPolicyIngressRule
		for j := r.IntN(3); j > 0; j-- {
			rule.From = append(rule.From, genPeer(r))
		}
		for j := r.IntN(3); j > 0; j-- {
			rule.Ports = append(rule.Ports, genPort(r))
		}
		p.Spec.Ingress = append(p.Spec.Ingress, rule)
	}
	for i := r.IntN(3); i > 0; i-- {
		var rule networkingv1.NetworkPolicyEgressRule
		for j := r.IntN(3); j > 0; j-- {
			rule.To = append(rule.To, genPeer(r))
		}
		for j := r.IntN(3); j > 0; j-- {
			rule.Ports = append(rule.Ports, genPort(r))
		}
		p.Spec.Egress = append(p.Spec.Egress, rule)
	}
	return p
}

// genPeers are the addresses a packet may come from or go to.
func genPeers() []netip.Addr {
	out := []netip.Addr{genHost, genRemoteNode, genExternal}
	for i := range genNamespaces {
		for j := range genPods {
			out = append(out, genPodIP(i, j))
		}
	}
	return out
}

var (
	genProtos    = []uint8{ProtoTCP, ProtoUDP, ProtoSCTP, 1 /* ICMP */}
	genPortsUsed = []uint16{0, 79, 80, 81, 82, 1023, 1024}
)

// checkAgainstEvaluate compares the compiled lookup with Evaluate for
// every local pod, direction, peer, protocol and port: the verdict and the
// stage always, and the deciding and Log rules of the cluster tiers. (Of
// several NetworkPolicy rules that allow, either may be named.) It returns
// the first disagreement.
func checkAgainstEvaluate(s *Snapshot, res *Result) error {
	for i := range s.Pods {
		pod := &s.Pods[i]
		if !pod.Local {
			continue
		}
		for _, d := range []Direction{Ingress, Egress} {
			for _, peer := range genPeers() {
				for _, proto := range genProtos {
					for _, port := range genPortsUsed {
						want := Evaluate(s, pod, d, peer, proto, port)
						got := res.Lookup(pod.Key(), d, peer, proto, port)
						if err := sameDecision(res, got, want); err != nil {
							return fmt.Errorf("%s %s peer %s proto %s port %d: %w",
								pod.Key(), d, peer, ProtoName(proto), port, err)
						}
						if err := kernelAgrees(res, pod.Key(), d, peer, proto, port, got); err != nil {
							return fmt.Errorf("%s %s peer %s proto %s port %d: %w",
								pod.Key(), d, peer, ProtoName(proto), port, err)
						}
					}
				}
			}
		}
	}
	return nil
}

// kernelAgrees holds the datapath's form of the entries to the
// decision: tier matches as KernelTier writes them, no conditional rules,
// decide the same verdict, stage, rules and Log; and a connection whose
// requests are inspected has an entry with conditional rules, so the
// datapath sends its requests to user space (policy_tiered_sets).
func kernelAgrees(res *Result, pod string, d Direction, peer netip.Addr, proto uint8, port uint16, want Decision) error {
	ep, ok := res.Endpoints[pod]
	if !ok || (!ep.Enforced[d] && !ep.Tiered[d]) {
		return nil
	}
	found := ep.lookup(res, d, peer, proto, port)
	var k [3]*Entry
	tiered := false
	for i, e := range found {
		if e == nil {
			continue
		}
		c := *e
		for t := range c.Tier {
			c.Tier[t] = e.KernelTier(Tier(t))
		}
		c.Cond, c.Tiers, c.L7 = [2]CondMatch{}, 0, c.HTTP
		k[i] = &c
		tiered = tiered || (e.Tiers != 0 && res.TieredSet(e.L7))
	}
	got := Decide(ep.Enforced[d], k)
	got.Inspect = want.Inspect
	if got != want {
		return fmt.Errorf("kernel form decides %+v, the entries %+v", got, want)
	}
	if want.Inspect && want.Allowed() && proto == ProtoTCP && !tiered {
		return fmt.Errorf("inspected (%+v) but no entry found is tiered: the datapath would not judge its requests", want)
	}
	return nil
}

func sameDecision(res *Result, got Decision, want Outcome) error {
	gotRule, gotLog := res.Rules[got.Rule], res.Rules[got.Log]
	if got.Log == 0 {
		gotLog = RuleRef{}
	}
	switch {
	case got.Verdict != want.Verdict || got.Stage != want.Stage:
		return fmt.Errorf("compiled %s at %s (rule %v), evaluated %s at %s (rule %v)",
			got.Verdict, got.Stage, gotRule, want.Verdict, want.Stage, want.Rule)
	case (want.Stage == StageAdmin || want.Stage == StageBaseline) && gotRule != want.Rule:
		return fmt.Errorf("compiled rule %v, evaluated %v", gotRule, want.Rule)
	case gotLog != want.Log:
		return fmt.Errorf("compiled log rule %v, evaluated %v", gotLog, want.Log)
	case got.Inspect != want.Inspect:
		return fmt.Errorf("compiled inspect %v, evaluated %v (%s at %s, rule %v)", got.Inspect, want.Inspect, want.Verdict, want.Stage, want.Rule)
	}
	return nil
}

// genNodes are the two nodes of the generated cluster.
func genNodes() []Node {
	return []Node{
		{Name: "n1", Labels: map[string]string{"node": "n1", "role": "worker"}, IPs: []netip.Addr{genHost}},
		{Name: "n2", Labels: map[string]string{"node": "n2"}, IPs: []netip.Addr{genRemoteNode}},
	}
}

// genClusterSnapshot is genSnapshot with cluster policies of both kinds
// and tiers, priorities that collide, and every action.
func genClusterSnapshot(r *rand.Rand, policies, clusterPolicies int) *Snapshot {
	s := genSnapshot(r, policies)
	s.Nodes = genNodes()
	for i := 0; i < clusterPolicies; i++ {
		p := genClusterPolicy(r, fmt.Sprintf("c%d", i))
		genClusterHTTP(r, p)
		s.ClusterPolicies = append(s.ClusterPolicies, p)
	}
	return s
}

// genClusterHTTP makes about half the rules of a WeirClusterNetworkPolicy
// conditional: on TCP port 80 (sometimes 81 too) with one or two HTTP
// rules of the generated vocabulary.
func genClusterHTTP(r *rand.Rand, p *ClusterPolicy) {
	if p.Kind != KindWeirClusterNetworkPolicy {
		return
	}
	p.HTTP = &ClusterHTTP{Ingress: make([][]l7.Rule, len(p.Spec.Ingress)), Egress: make([][]l7.Rule, len(p.Spec.Egress))}
	conditional := func(protos *[]npav1alpha2.ClusterNetworkPolicyProtocol) []l7.Rule {
		if r.IntN(2) == 0 {
			return nil
		}
		*protos = []npav1alpha2.ClusterNetworkPolicyProtocol{{TCP: &npav1alpha2.ClusterNetworkPolicyProtocolTCP{
			DestinationPort: &npav1alpha2.Port{Number: 80}}}}
		if r.IntN(3) == 0 {
			*protos = append(*protos, npav1alpha2.ClusterNetworkPolicyProtocol{TCP: &npav1alpha2.ClusterNetworkPolicyProtocolTCP{
				DestinationPort: &npav1alpha2.Port{Number: 81}}})
		}
		var rules []l7.Rule
		for k := 1 + r.IntN(2); k > 0; k-- {
			rules = append(rules, genHTTPRules[r.IntN(len(genHTTPRules))])
		}
		return rules
	}
	for i := range p.Spec.Ingress {
		p.HTTP.Ingress[i] = conditional(&p.Spec.Ingress[i].Protocols)
	}
	for i := range p.Spec.Egress {
		p.HTTP.Egress[i] = conditional(&p.Spec.Egress[i].Protocols)
	}
}

func genClusterPolicy(r *rand.Rand, name string) *ClusterPolicy {
	p := &ClusterPolicy{Kind: KindClusterNetworkPolicy, Name: name}
	actions := []string{"Accept", "Deny", "Pass"}
	if r.IntN(2) == 0 {
		p.Kind = KindWeirClusterNetworkPolicy
		actions = append(actions, "Reject", "Log")
	}
	p.Spec.Tier = npav1alpha2.AdminTier
	if r.IntN(3) == 0 {
		p.Spec.Tier = npav1alpha2.BaselineTier
	}
	p.Spec.Priority = []int32{0, 5, 5, 10}[r.IntN(4)]
	if r.IntN(2) == 0 {
		p.Spec.Subject.Namespaces = genSelector(r, "ns", genNamespaces)
	} else {
		p.Spec.Subject.Pods = &npav1alpha2.NamespacedPod{
			NamespaceSelector: *genSelector(r, "ns", genNamespaces), PodSelector: *genSelector(r, "pod", genPods)}
	}
	for i := r.IntN(4); i > 0; i-- {
		rule := npav1alpha2.ClusterNetworkPolicyIngressRule{Name: fmt.Sprintf("in-%d", i),
			Action: npav1alpha2.ClusterNetworkPolicyRuleAction(actions[r.IntN(len(actions))])}
		for j := 1 + r.IntN(2); j > 0; j-- {
			peer := genClusterPeer(r, false)
			rule.From = append(rule.From, npav1alpha2.ClusterNetworkPolicyIngressPeer{Namespaces: peer.Namespaces, Pods: peer.Pods})
		}
		rule.Protocols = genClusterProtocols(r)
		p.Spec.Ingress = append(p.Spec.Ingress, rule)
	}
	for i := r.IntN(4); i > 0; i-- {
		rule := npav1alpha2.ClusterNetworkPolicyEgressRule{Name: fmt.Sprintf("out-%d", i),
			Action: npav1alpha2.ClusterNetworkPolicyRuleAction(actions[r.IntN(len(actions))])}
		for j := 1 + r.IntN(2); j > 0; j-- {
			rule.To = append(rule.To, genClusterPeer(r, true))
		}
		rule.Protocols = genClusterProtocols(r)
		p.Spec.Egress = append(p.Spec.Egress, rule)
	}
	return p
}

func genClusterPeer(r *rand.Rand, egress bool) npav1alpha2.ClusterNetworkPolicyEgressPeer {
	n := 2
	if egress {
		n = 4
	}
	switch r.IntN(n) {
	case 0:
		return npav1alpha2.ClusterNetworkPolicyEgressPeer{Namespaces: genSelector(r, "ns", genNamespaces)}
	case 1:
		return npav1alpha2.ClusterNetworkPolicyEgressPeer{Pods: &npav1alpha2.NamespacedPod{
			NamespaceSelector: *genSelector(r, "ns", genNamespaces), PodSelector: *genSelector(r, "pod", genPods)}}
	case 2:
		sel := []*metav1.LabelSelector{{}, {MatchLabels: map[string]string{"role": "worker"}}}[r.IntN(2)]
		return npav1alpha2.ClusterNetworkPolicyEgressPeer{Nodes: sel}
	}
	nets := [][]npav1alpha2.CIDR{
		{"10.0.0.0/16"}, {"10.0.1.0/24", npav1alpha2.CIDR(genPodIP(1, 2).String() + "/32")},
		{"0.0.0.0/0"}, {"172.16.0.0/12"}, {"192.168.0.0/31"},
	}
	return npav1alpha2.ClusterNetworkPolicyEgressPeer{Networks: nets[r.IntN(len(nets))]}
}

func genClusterProtocols(r *rand.Rand) []npav1alpha2.ClusterNetworkPolicyProtocol {
	var out []npav1alpha2.ClusterNetworkPolicyProtocol
	for i := r.IntN(3); i > 0; i-- {
		var p npav1alpha2.ClusterNetworkPolicyProtocol
		switch r.IntN(6) {
		case 0:
			p.TCP = &npav1alpha2.ClusterNetworkPolicyProtocolTCP{DestinationPort: &npav1alpha2.Port{Number: 80}}
		case 1:
			p.UDP = &npav1alpha2.ClusterNetworkPolicyProtocolUDP{DestinationPort: &npav1alpha2.Port{Number: 81}}
		case 2:
			p.TCP = &npav1alpha2.ClusterNetworkPolicyProtocolTCP{DestinationPort: &npav1alpha2.Port{
				Range: &npav1alpha2.PortRange{Start: 79, End: 81}}}
		case 3:
			p.TCP = &npav1alpha2.ClusterNetworkPolicyProtocolTCP{}
		case 4:
			p.DestinationNamedPort = []string{"web", "serve-80-tcp", "serve-81-udp"}[r.IntN(3)]
		default:
			p.SCTP = &npav1alpha2.ClusterNetworkPolicyProtocolSCTP{DestinationPort: &npav1alpha2.Port{Number: 80}}
		}
		out = append(out, p)
	}
	return out
}

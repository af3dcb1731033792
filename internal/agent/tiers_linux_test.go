package agent

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/policy"
)

// auditAndReject is a WeirClusterNetworkPolicy on the pods with
// app=server: rule 0 logs every pod's traffic, rule 1 rejects app=client
// on TCP 8081 and UDP 9000.
func auditAndReject() *policy.ClusterPolicy {
	p := &policy.ClusterPolicy{Kind: policy.KindWeirClusterNetworkPolicy, Name: "audit-and-reject"}
	p.Spec.Tier = npav1alpha2.AdminTier
	p.Spec.Subject.Pods = &npav1alpha2.NamespacedPod{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}}}
	p.Spec.Ingress = []npav1alpha2.ClusterNetworkPolicyIngressRule{
		{Name: "audit", Action: "Log", From: []npav1alpha2.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}}},
		{Name: "no-client", Action: "Reject", From: []npav1alpha2.ClusterNetworkPolicyIngressPeer{{Pods: &npav1alpha2.NamespacedPod{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}}},
			Protocols: []npav1alpha2.ClusterNetworkPolicyProtocol{
				{TCP: &npav1alpha2.ClusterNetworkPolicyProtocolTCP{DestinationPort: &npav1alpha2.Port{Number: 8081}}},
				{UDP: &npav1alpha2.ClusterNetworkPolicyProtocolUDP{DestinationPort: &npav1alpha2.Port{Number: 9000}}}}},
	}
	return p
}

// TestRejectAndLogWithRealPackets: through real sockets, a rejected TCP
// connect fails at once with ECONNREFUSED and a rejected UDP datagram
// with EHOSTUNREACH (no timeouts), an allowed connection goes through,
// and the flows name the Reject rule and the Log rule they passed.
func TestRejectAndLogWithRealPackets(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	client, server := n.newPod(), n.newPod()
	sr := n.clientAndServer(client, server, nil, auditAndReject())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := n.agent.readFlows(ctx, n.dp); err != nil {
		t.Fatal(err)
	}
	srv := sr.Address.Addr().String()
	var open, rejected net.Listener
	var udp net.PacketConn
	in(t, server, func() (err error) {
		if open, err = net.Listen("tcp4", ":8080"); err != nil {
			return err
		}
		if rejected, err = net.Listen("tcp4", ":8081"); err != nil {
			return err
		}
		udp, err = net.ListenPacket("udp4", ":9000")
		return err
	})
	defer open.Close()
	defer rejected.Close()
	defer udp.Close()
	go serveTCP(open)
	go serveTCP(rejected)
	go serveUDP(udp)

	in(t, client, func() error {
		c, err := net.DialTimeout("tcp4", srv+":8080", 3*time.Second)
		if err != nil {
			t.Errorf("allowed connect: %v", err)
			return nil
		}
		return c.Close()
	})
	in(t, client, func() error {
		start := time.Now()
		_, err := net.DialTimeout("tcp4", srv+":8081", 3*time.Second)
		if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
			t.Errorf("rejected connect: %v after %v, want ECONNREFUSED at once", err, time.Since(start))
		}
		return nil
	})
	in(t, client, func() error {
		c, err := net.Dial("udp4", srv+":9000")
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		_, err = c.Read(make([]byte, 16))
		if !errors.Is(err, syscall.EHOSTUNREACH) {
			t.Errorf("rejected datagram: read %v, want EHOSTUNREACH from the ICMP answer", err)
		}
		return nil
	})

	want := map[string]bool{"allowed 8080": false, "rejected 8081": false, "rejected 9000": false}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && !(want["allowed 8080"] && want["rejected 8081"] && want["rejected 9000"]) {
		flows, err := n.agent.flows.recent()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range flows {
			if f.Pod != "default/server" || f.LoggedBy == nil || f.LoggedBy.RuleName != "audit" {
				continue
			}
			_, port, _ := net.SplitHostPort(f.Dst)
			key := f.Verdict + " " + port
			if _, ok := want[key]; !ok {
				continue
			}
			if f.Verdict == "rejected" && (f.Decider == nil || f.Decider.Index != 1 || f.Decider.Action != "Reject" || f.Stage != "admin") {
				t.Fatalf("rejected flow names %+v at %q, want rule 1 (Reject) at admin", f.Decider, f.Stage)
			}
			want[key] = true
		}
		time.Sleep(50 * time.Millisecond)
	}
	for k, seen := range want {
		if !seen {
			flows, _ := n.agent.flows.recent()
			t.Errorf("no %s flow on the server logged by the audit rule; flows: %+v", k, flowsOf(flows))
		}
	}
}

// clientAndServer adds pods default/client (app=client) and
// default/server (app=server) in the given namespaces, under a snapshot
// holding them, the pods of remote (other nodes' pods, which need IPs) and
// the cluster policies, and returns the server's ADD result.
func (n *testNode) clientAndServer(client, server ns.NetNS, remote []k8s.Pod, cps ...*policy.ClusterPolicy) *api.AddResponse {
	n.t.Helper()
	nsLabels := map[string]string{"kubernetes.io/metadata.name": "default"}
	local := []k8s.Pod{
		{Namespace: "default", Name: "client", Labels: map[string]string{"app": "client"}, NodeName: "n1"},
		{Namespace: "default", Name: "server", Labels: map[string]string{"app": "server"}, NodeName: "n1"},
	}
	all := append(append([]k8s.Pod{}, local...), remote...)
	ids := map[string]policy.Identity{}
	for _, p := range all {
		key := policy.IdentityLabels(policy.Namespace{Name: "default", Labels: nsLabels}, p.Labels).Key()
		if _, ok := ids[key]; !ok {
			ids[key] = policy.MinClusterIdentity + policy.Identity(len(ids))
		}
	}
	n.ids = ids
	n.agent.snapshot = func() (k8s.Snapshot, bool) {
		return k8s.Snapshot{
			Namespaces: map[string]map[string]string{"default": nsLabels},
			Pods:       local, ClusterPods: all, Identities: ids, ClusterPolicies: cps,
		}, true
	}
	if _, err := n.agent.Add(addReq("client", client)); err != nil {
		n.t.Fatal(err)
	}
	sr, err := n.agent.Add(addReq("server", server))
	if err != nil {
		n.t.Fatal(err)
	}
	return sr
}

// identity is the identity clientAndServer gave pods of namespace default
// with labels.
func (n *testNode) identity(labels map[string]string) policy.Identity {
	n.t.Helper()
	nsLabels := map[string]string{"kubernetes.io/metadata.name": "default"}
	id, ok := n.ids[policy.IdentityLabels(policy.Namespace{Name: "default", Labels: nsLabels}, labels).Key()]
	if !ok {
		n.t.Fatalf("no identity numbered for %v", labels)
	}
	return id
}

func flowsOf(fs []api.Flow) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Verdict+" "+f.Pod+" "+f.Dst+" "+f.Rule)
	}
	return out
}

package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/weirnet/weir/internal/policy"
	"github.com/weirnet/weir/internal/testutil"
)

// onlyServer is the server's ingress: proto from app=client (rule
// name), nothing else; and the client's: nothing at all. Replies and what
// belongs to an allowed flow must still arrive, as a tracked flow.
func onlyServer(name string, proto npav1alpha2.ClusterNetworkPolicyProtocol) []*policy.ClusterPolicy {
	pods := func(app string) *npav1alpha2.NamespacedPod {
		return &npav1alpha2.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}
	}
	everyone := []npav1alpha2.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}}
	server := &policy.ClusterPolicy{Kind: policy.KindWeirClusterNetworkPolicy, Name: "server-" + name}
	server.Spec.Tier, server.Spec.Priority = npav1alpha2.AdminTier, 1
	server.Spec.Subject.Pods = pods("server")
	server.Spec.Ingress = []npav1alpha2.ClusterNetworkPolicyIngressRule{
		{Name: "client-" + name, Action: "Accept", From: []npav1alpha2.ClusterNetworkPolicyIngressPeer{{Pods: pods("client")}},
			Protocols: []npav1alpha2.ClusterNetworkPolicyProtocol{proto}},
		{Name: "rest", Action: "Deny", From: everyone},
	}
	client := &policy.ClusterPolicy{Kind: policy.KindWeirClusterNetworkPolicy, Name: "client-closed"}
	client.Spec.Tier, client.Spec.Priority = npav1alpha2.AdminTier, 2
	client.Spec.Subject.Pods = pods("client")
	client.Spec.Ingress = []npav1alpha2.ClusterNetworkPolicyIngressRule{{Name: "closed", Action: "Deny", From: everyone}}
	return []*policy.ClusterPolicy{server, client}
}

// udpOnlyServer: onlyServer with UDP 9000-9001.
func udpOnlyServer() []*policy.ClusterPolicy {
	return onlyServer("udp", npav1alpha2.ClusterNetworkPolicyProtocol{UDP: &npav1alpha2.ClusterNetworkPolicyProtocolUDP{
		DestinationPort: &npav1alpha2.Port{Range: &npav1alpha2.PortRange{Start: 9000, End: 9001}}}})
}

// TestFragmentsAndICMPErrorsOfAllowedFlows: through real sockets, under a
// port-scoped allow, a 4,000-byte datagram (three fragments at the pod
// MTU) reaches the server and its 4,000-byte answer reaches the client,
// whose ingress is closed; a datagram to an allowed port with no listener
// fails at once with ECONNREFUSED (the server's port unreachable is
// related to the flow) instead of timing out.
func TestFragmentsAndICMPErrorsOfAllowedFlows(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	client, server := n.newPod(), n.newPod()
	sr := n.clientAndServer(client, server, nil, udpOnlyServer()...)
	srv := sr.Address.Addr().String()
	var pc net.PacketConn
	in(t, server, func() (err error) { pc, err = net.ListenPacket("udp4", ":9000"); return err })
	defer pc.Close()
	go serveUDPEcho(pc)
	before, err := n.dp.Metrics()
	if err != nil {
		t.Fatal(err)
	}

	big := bytes.Repeat([]byte("weir"), 1000)
	in(t, client, func() error {
		c, err := net.Dial("udp4", srv+":9000")
		if err != nil {
			return err
		}
		defer c.Close()
		got := make([]byte, 8192)
		for attempt := 0; attempt < 3; attempt++ {
			if _, err := c.Write(big); err != nil {
				return err
			}
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			k, err := c.Read(got)
			if err == nil && bytes.Equal(got[:k], big) {
				return nil
			}
		}
		t.Errorf("a %d-byte datagram to an allowed port and its echo never made the round trip", len(big))
		return nil
	})
	expectRefusedAtOnce(t, client, srv+":9001", "datagram to a closed, allowed port")
	after, err := n.dp.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if after["ct_related"] == before["ct_related"] {
		t.Error("ct_related did not grow: the port unreachable did not pass as related")
	}
	if d := after["drop_fragment"] - before["drop_fragment"]; d != 0 {
		t.Errorf("drop_fragment grew by %d, want 0", d)
	}
}

// TestICMPErrorOfATranslatedFlow: the client calls a virtual address the
// node's stack translates (DNAT, as kube-proxy does) to a closed, allowed
// port of the server. The server's port unreachable quotes the translated
// packet; it must go back through the stack, which translates the quote
// back, so the client's socket (connected to the virtual address) fails at
// once with ECONNREFUSED, its ingress closed all the while.
func TestICMPErrorOfATranslatedFlow(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	client, server := n.newPod(), n.newPod()
	sr := n.clientAndServer(client, server, nil, udpOnlyServer()...)
	const vip = "10.96.99.99"
	rules := "table ip weirtest {\n chain pre {\n  type nat hook prerouting priority -100;\n" +
		"  ip daddr " + vip + " udp dport 9001 dnat to " + sr.Address.Addr().String() + ":9001\n }\n}\n"
	n.loadNFT(t, rules)
	before, err := n.dp.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	expectRefusedAtOnce(t, client, vip+":9001", "datagram to a translated, closed port")
	after, err := n.dp.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if after["pass_stack_nat"] == before["pass_stack_nat"] {
		t.Error("pass_stack_nat did not grow: the error was not handed to the stack")
	}
}

// expectRefusedAtOnce sends a datagram from pod to addr and wants the
// read to fail with ECONNREFUSED within a second: the ICMP port
// unreachable arrived, instead of a 3 s timeout.
func expectRefusedAtOnce(t *testing.T, pod ns.NetNS, addr, what string) {
	t.Helper()
	in(t, pod, func() error {
		c, err := net.Dial("udp4", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		start := time.Now()
		_ = c.SetDeadline(start.Add(3 * time.Second))
		if _, err := c.Write([]byte("anyone?")); err != nil {
			return err
		}
		_, err = c.Read(make([]byte, 16))
		if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
			t.Errorf("%s: %v after %v, want ECONNREFUSED at once", what, err, time.Since(start))
		}
		return nil
	})
}

// TestPodIPAfterTranslatedConnectionFromTheSamePort: a client calls a
// virtual address the node's stack translates (DNAT, as kube-proxy does)
// to the server, the server closes, and the client then calls the
// server's own address from the same source port. The first flow's
// conntrack entry, over but kept for minutes (TIME_WAIT), shares the new
// flow's reply tuple; the new flow, which the stack never saw, must still
// connect at once instead of having its replies translated back to the
// virtual address and lost.
func TestPodIPAfterTranslatedConnectionFromTheSamePort(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	client, server := n.newPod(), n.newPod()
	sr := n.clientAndServer(client, server, nil)
	listenIn(t, server, 8080, func(ln net.Listener) { serveNamed(ln, "server") }, 0)
	const vip = "10.96.99.98"
	rules := "table ip weirtest {\n chain pre {\n  type nat hook prerouting priority -100;\n" +
		"  ip daddr " + vip + " tcp dport 80 dnat to " + sr.Address.Addr().String() + ":8080\n }\n}\n"
	n.loadNFT(t, rules)
	const port = 41234
	call := func(addr string) error {
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{Port: port}}
		c, err := d.Dial("tcp4", addr)
		if err != nil {
			return fmt.Errorf("from port %d to %s: %w", port, addr, err)
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		b, err := io.ReadAll(c)
		if err != nil || string(b) != "server" {
			return fmt.Errorf("from port %d to %s: read %q, %v", port, addr, b, err)
		}
		return nil
	}
	in(t, client, func() error { return call(vip + ":80") })
	// The server closed first: the translated flow's entry is in TIME_WAIT.
	in(t, client, func() error { return call(net.JoinHostPort(sr.Address.Addr().String(), "8080")) })
}

// loadNFT loads an nftables ruleset into the node's namespace: a
// translation of the node's stack, as kube-proxy makes. The namespace
// takes it with it.
func (n *testNode) loadNFT(t *testing.T, rules string) {
	t.Helper()
	cmd := exec.Command("nsenter", "--net="+n.nodeNS.Path(), "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		if testutil.InCI() {
			t.Fatalf("nft: %v %s", err, out)
		}
		t.Skipf("nft: %v %s", err, out)
	}
}

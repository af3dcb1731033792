package agent

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/policy"
	"github.com/weirnet/weir/internal/testutil"
)

var (
	peerNodeIP = netip.MustParseAddr("10.99.0.12") // a peer node, owner of peerPodCIDR
	strangerIP = netip.MustParseAddr("10.99.0.66") // on the underlay, but no node
	peerPodIP  = netip.MustParseAddr("10.244.9.5")
)

const peerPodCIDR = "10.244.9.0/24"

// underlayPeer moves the far end of the node's underlay into a fresh
// namespace holding the given addresses: another host on the node's
// network, which the test sends from.
func underlayPeer(t *testing.T, n *testNode, addrs ...netip.Addr) (ns.NetNS, net.HardwareAddr) {
	t.Helper()
	far := testutil.NewNS(t)
	inNode(t, n, func() error {
		l, err := netlink.LinkByName("eth0peer")
		if err != nil {
			return err
		}
		return netlink.LinkSetNsFd(l, int(far.Fd()))
	})
	var mac net.HardwareAddr
	in(t, far, func() error {
		l, err := netlink.LinkByName("eth0peer")
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
				return err
			}
		}
		mac = l.Attrs().HardwareAddr
		return netlink.LinkSetUp(l)
	})
	return far, mac
}

// udpCatcher listens on UDP port in pod and reports each payload.
func udpCatcher(t *testing.T, pod ns.NetNS, port int) <-chan string {
	t.Helper()
	var pc net.PacketConn
	in(t, pod, func() (err error) { pc, err = net.ListenPacket("udp4", fmt.Sprintf(":%d", port)); return err })
	t.Cleanup(func() { pc.Close() })
	got := make(chan string, 16)
	go func() {
		buf := make([]byte, 256)
		for {
			k, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			got <- string(buf[:k])
		}
	}()
	return got
}

// expectOnly waits for want on got and fails on anything else.
func expectOnly(t *testing.T, got <-chan string, want string) {
	t.Helper()
	select {
	case g := <-got:
		if g != want {
			t.Fatalf("the pod received %q", g)
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("%q never arrived: the test's packets are wrong", want)
	}
	select {
	case g := <-got:
		t.Fatalf("the pod received %q", g)
	case <-time.After(300 * time.Millisecond):
	}
}

// vxlanPacket is a VXLAN payload (header and inner frame) carrying an
// IPv4 UDP datagram from src to dst, with identity vni.
func vxlanPacket(src, dst netip.Addr, vni uint32, payload string) []byte {
	h := make([]byte, 8)
	h[0] = 0x08 // I flag: the VNI is valid
	binary.BigEndian.PutUint32(h[4:8], vni<<8)
	mac := net.HardwareAddr{0x02, 0, 0, 0, 0x99, 0x99}
	return append(h, testutil.IPv4UDP(mac, mac, src, dst, 40000, 7000, []byte(payload))...)
}

// TestOverlayRefusesWhatNoNodeCouldSend sends real VXLAN packets to the
// node's VXLAN port from a host on its network: a registered peer's own
// pod is delivered; the same peer speaking as one of this node's pods, as
// a pod of another peer's CIDR, and a host that is no node speaking as
// the peer's pod are not.
func TestOverlayRefusesWhatNoNodeCouldSend(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	client, server := n.newPod(), n.newPod()
	sr := n.clientAndServer(client, server, nil)
	clientIP, serverIP := podAddr(t, client)[0], sr.Address.Addr()
	far, _ := underlayPeer(t, n, peerNodeIP, strangerIP)
	if err := n.agent.SetPeers([]api.Peer{
		{Name: "n2", NodeIP: peerNodeIP, PodCIDR: netip.MustParsePrefix(peerPodCIDR)},
		{Name: "n3", NodeIP: netip.MustParseAddr("10.99.0.13"), PodCIDR: netip.MustParsePrefix("10.244.7.0/24")},
	}); err != nil {
		t.Fatal(err)
	}
	got := udpCatcher(t, server, 7000)
	before, err := n.dp.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	send := func(from netip.Addr, pkt []byte) {
		t.Helper()
		in(t, far, func() error {
			c, err := net.DialUDP("udp4", &net.UDPAddr{IP: from.AsSlice()}, &net.UDPAddr{IP: n.cfg.NodeIP.AsSlice(), Port: datapath.VXLANPort})
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write(pkt)
			return err
		})
	}
	send(peerNodeIP, vxlanPacket(clientIP, serverIP, 256, "peer as this node's pod"))
	send(peerNodeIP, vxlanPacket(netip.MustParseAddr("10.244.7.9"), serverIP, 256, "peer as another peer's pod"))
	send(strangerIP, vxlanPacket(peerPodIP, serverIP, 256, "stranger as the peer's pod"))
	send(strangerIP, vxlanPacket(strangerIP, serverIP, 256, "stranger as itself"))
	send(peerNodeIP, vxlanPacket(peerPodIP, serverIP, 256, "peer's own pod"))
	expectOnly(t, got, "peer's own pod")
	after, err := n.dp.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if d := after["drop_tunnel_source"] - before["drop_tunnel_source"]; d != 4 {
		t.Errorf("drop_tunnel_source grew by %d, want 4", d)
	}
}

// knownPeer registers peer n2 (peerNodeIP, owner of peerPodCIDR) on a
// host of the node's network that the test sends from, and lets the node
// know the peer's MAC, as after any exchange. It returns the peer's
// namespace and MAC and the node's underlay MAC.
func knownPeer(t *testing.T, n *testNode) (far ns.NetNS, farMAC, nodeMAC net.HardwareAddr) {
	t.Helper()
	far, farMAC = underlayPeer(t, n, peerNodeIP)
	if err := n.agent.SetPeers([]api.Peer{{Name: "n2", NodeIP: peerNodeIP, PodCIDR: netip.MustParsePrefix(peerPodCIDR)}}); err != nil {
		t.Fatal(err)
	}
	inNode(t, n, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		nodeMAC = l.Attrs().HardwareAddr
		return netlink.NeighSet(&netlink.Neigh{LinkIndex: l.Attrs().Index, IP: peerNodeIP.AsSlice(),
			HardwareAddr: farMAC, State: netlink.NUD_PERMANENT, Family: netlink.FAMILY_V4})
	})
	return far, farMAC, nodeMAC
}

// TestUnderlayRefusesWhatNoNodeCouldSend, in both routing modes: from a
// host on the node's network, frames speaking as one of this node's pods,
// as an address of its pod CIDR, as a pod address no node owns, as the
// node itself, or as the peer's pod from a MAC that is not the peer's,
// never reach a pod; the peer's own pod, from the peer, does.
func TestUnderlayRefusesWhatNoNodeCouldSend(t *testing.T) {
	for _, mode := range []datapath.Mode{datapath.ModeNative, datapath.ModeVXLAN} {
		t.Run(string(mode), func(t *testing.T) {
			n := newTestNodeMode(t, "10.244.1.0/24", mode)
			client, server := n.newPod(), n.newPod()
			sr := n.clientAndServer(client, server, nil)
			clientIP, serverIP := podAddr(t, client)[0], sr.Address.Addr()
			far, farMAC, nodeMAC := knownPeer(t, n)
			got := udpCatcher(t, server, 7000)
			before, err := n.dp.Metrics()
			if err != nil {
				t.Fatal(err)
			}
			forged := net.HardwareAddr{0x02, 0, 0, 0, 0x66, 0x66}
			frame := func(mac net.HardwareAddr, src netip.Addr, what string) []byte {
				return testutil.IPv4UDP(nodeMAC, mac, src, serverIP, 40000, 7000, []byte(what))
			}
			in(t, far, func() error {
				return testutil.SendFrames("eth0peer",
					frame(farMAC, clientIP, "as this node's pod"),
					frame(farMAC, netip.MustParseAddr("10.244.1.250"), "as this node's pod CIDR"),
					frame(farMAC, netip.MustParseAddr("10.244.50.1"), "as a pod no node owns"),
					frame(farMAC, n.cfg.NodeIP, "as the node itself"),
					frame(forged, peerPodIP, "as the peer's pod from another MAC"),
					frame(farMAC, peerPodIP, "peer's own pod"))
			})
			expectOnly(t, got, "peer's own pod")
			after, err := n.dp.Metrics()
			if err != nil {
				t.Fatal(err)
			}
			if d := after["drop_tunnel_source"] - before["drop_tunnel_source"]; d != 5 {
				t.Errorf("drop_tunnel_source grew by %d, want 5", d)
			}
		})
	}
}

// identityOption is the IPv4 option a node puts into natively routed
// packets that open a flow (bpf/lib/nativeid.h).
func identityOption(id policy.Identity) []byte { return []byte{0x9e, 4, byte(id >> 8), byte(id)} }

// TestNativeIdentityTravelsWithNewPods, with real packets in native
// routing. Arriving: replicas of a peer's pods whose addresses this node
// has not learned are judged by the identity their node put into the
// packet, so the one whose labels are denied stays out, the one whose
// labels are allowed gets in from its first datagram, and one without an
// identity is unidentified and denied. Leaving: a pod's datagram to a
// peer's pod reaches the underlay with the pod's identity as its first
// IPv4 option.
func TestNativeIdentityTravelsWithNewPods(t *testing.T) {
	n := newTestNodeMode(t, "10.244.1.0/24", datapath.ModeNative)
	client, server := n.newPod(), n.newPod()
	friend, enemy := map[string]string{"app": "friend"}, map[string]string{"app": "enemy"}
	remote := []k8s.Pod{
		{Namespace: "default", Name: "friend", Labels: friend, IPs: []netip.Addr{netip.MustParseAddr("10.244.9.5")}, NodeName: "n2"},
		{Namespace: "default", Name: "enemy", Labels: enemy, IPs: []netip.Addr{netip.MustParseAddr("10.244.9.6")}, NodeName: "n2"},
	}
	deny := &policy.ClusterPolicy{Kind: policy.KindClusterNetworkPolicy, Name: "no-enemy"}
	deny.Spec.Tier = npav1alpha2.AdminTier
	deny.Spec.Subject.Pods = &npav1alpha2.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}}}
	deny.Spec.Ingress = []npav1alpha2.ClusterNetworkPolicyIngressRule{{Name: "no-enemy", Action: "Deny",
		From: []npav1alpha2.ClusterNetworkPolicyIngressPeer{{Pods: &npav1alpha2.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: enemy}}}}}}
	sr := n.clientAndServer(client, server, remote, deny)
	serverIP := sr.Address.Addr()
	far, farMAC, nodeMAC := knownPeer(t, n)

	got := udpCatcher(t, server, 7000)
	before, err := n.dp.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	frame := func(src string, what string) []byte {
		return testutil.IPv4UDP(nodeMAC, farMAC, netip.MustParseAddr(src), serverIP, 40000, 7000, []byte(what))
	}
	in(t, far, func() error {
		return testutil.SendFrames("eth0peer",
			testutil.IPv4WithOption(frame("10.244.9.20", "enemy's new replica"), identityOption(n.identity(enemy))),
			frame("10.244.9.21", "a new pod without its identity"),
			testutil.IPv4WithOption(frame("10.244.9.22", "friend's new replica"), identityOption(n.identity(friend))))
	})
	expectOnly(t, got, "friend's new replica")
	after, err := n.dp.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if d := after["identity_option_read"] - before["identity_option_read"]; d != 2 {
		t.Errorf("identity_option_read grew by %d, want 2", d)
	}

	var capture *testutil.Capture
	in(t, far, func() (err error) { capture, err = testutil.OpenCapture("eth0peer"); return err })
	defer capture.Close()
	peerPod := netip.MustParseAddr("10.244.9.30")
	in(t, client, func() error {
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: peerPod.AsSlice(), Port: 7000})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("to a peer's pod"))
		return err
	})
	out, err := capture.Next(3*time.Second, func(f []byte) bool {
		return len(f) >= 34 && netip.AddrFrom4([4]byte(f[14+16:14+20])) == peerPod
	})
	if err != nil {
		t.Fatalf("the client's datagram never reached the underlay: %v", err)
	}
	ihl := int(out[14]&0xf) * 4
	if want := identityOption(n.identity(map[string]string{"app": "client"})); ihl < 24 || !bytes.Equal(out[14+20:14+24], want) {
		t.Fatalf("the client's datagram left with IPv4 header % x, want the option % x first", out[14:14+ihl], want)
	}
	if testutil.Checksum(out[14:14+ihl]) != 0 {
		t.Errorf("the client's datagram left with a bad IPv4 header checksum")
	}
}

package agent

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
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
			far, farMAC := underlayPeer(t, n, peerNodeIP)
			if err := n.agent.SetPeers([]api.Peer{{Name: "n2", NodeIP: peerNodeIP, PodCIDR: netip.MustParsePrefix(peerPodCIDR)}}); err != nil {
				t.Fatal(err)
			}
			var nodeMAC net.HardwareAddr
			inNode(t, n, func() error {
				l, err := netlink.LinkByName("eth0")
				if err != nil {
					return err
				}
				nodeMAC = l.Attrs().HardwareAddr
				// The node knows its peer's MAC, as after any exchange.
				return netlink.NeighSet(&netlink.Neigh{LinkIndex: l.Attrs().Index, IP: peerNodeIP.AsSlice(),
					HardwareAddr: farMAC, State: netlink.NUD_PERMANENT, Family: netlink.FAMILY_V4})
			})
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

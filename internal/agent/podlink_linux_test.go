package agent

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weirnet/weir/internal/testutil"
)

// TestPodLinkFramesNeverReachTheNode tries, from a pod with CAP_NET_RAW,
// every frame that used to pass to the node's stack unjudged: IPv4 behind
// a priority tag and behind two tags (with a forged source), a router
// advertisement, and IPv6 to the node's link-local address on the veth.
// None may arrive, each is counted by its reason, and the same IPv4
// datagram untagged, and the same advertisement on a plain veth, do
// arrive (so the frames are ones the stack would take).
func TestPodLinkFramesNeverReachTheNode(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	client, server := n.newPod(), n.newPod()
	n.clientAndServer(client, server, nil)
	clientIP := podAddr(t, client)[0]
	nodeIP := n.cfg.NodeIP
	hostMAC, podMAC := vethMACs(t, n, client)

	var udp net.PacketConn
	inNode(t, n, func() (err error) { udp, err = net.ListenPacket("udp4", nodeIP.String()+":9999"); return err })
	defer udp.Close()
	received := make(chan string, 16)
	go func() {
		buf := make([]byte, 256)
		for {
			k, _, err := udp.ReadFrom(buf)
			if err != nil {
				return
			}
			received <- string(buf[:k])
		}
	}()

	before, err := n.dp.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	plain := testutil.IPv4UDP(hostMAC, podMAC, clientIP, nodeIP, 40000, 9999, []byte("plain"))
	forged := testutil.IPv4UDP(hostMAC, podMAC, netip.MustParseAddr("10.244.1.200"), nodeIP, 40000, 9999, []byte("qinq"))
	in(t, client, func() error {
		return testutil.SendFrames("eth0",
			testutil.VLANTagged(testutil.IPv4UDP(hostMAC, podMAC, clientIP, nodeIP, 40000, 9999, []byte("priority")), testutil.Ether8021Q, 0),
			testutil.VLANTagged(testutil.VLANTagged(forged, testutil.Ether8021Q, 0), testutil.Ether8021AD, 0),
			plain)
	})
	select {
	case got := <-received:
		if got != "plain" {
			t.Fatalf("the node received the tagged datagram %q", got)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the untagged datagram never arrived: the test's frames are wrong")
	}
	select {
	case got := <-received:
		t.Fatalf("the node received the tagged datagram %q", got)
	case <-time.After(300 * time.Millisecond):
	}

	// A router advertisement: first on a plain veth, to show the kernel
	// takes it, then from the pod.
	ra := func(src net.HardwareAddr) []byte {
		return testutil.RouterAdvertisement(src, netip.MustParseAddr("fe80::bad"), netip.MustParsePrefix("2001:db8:bad::/64"), 1800)
	}
	if !acceptsRouterAdvertisement(t, ra) {
		t.Fatal("a plain veth ignored the router advertisement: the test's frame is wrong")
	}
	in(t, client, func() error { return testutil.SendFrames("eth0", ra(podMAC)) })
	time.Sleep(300 * time.Millisecond)
	inNode(t, n, func() error {
		if r := ipv6DefaultRoutes(t); len(r) != 0 {
			t.Errorf("the pod's router advertisement gave the node default routes %v", r)
		}
		return nil
	})

	// IPv6 to the node on the veth's link-local address: a listener on
	// every address of the node must not answer the pod.
	var ln net.Listener
	inNode(t, n, func() (err error) { ln, err = net.Listen("tcp6", "[::]:9998"); return err })
	defer ln.Close()
	go serveTCP(ln)
	hostLL := linkLocal(t, n.nodeNS, hostVethName(t, n, client))
	waitLinkLocal(t, client, "eth0")
	in(t, client, func() error {
		c, err := net.DialTimeout("tcp6", fmt.Sprintf("[%s%%eth0]:9998", hostLL), 700*time.Millisecond)
		if err == nil {
			c.Close()
			t.Errorf("the pod reached the node's listener on %s over IPv6", hostLL)
		}
		return nil
	})

	after, err := n.dp.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if d := after["drop_vlan"] - before["drop_vlan"]; d != 2 {
		t.Errorf("drop_vlan grew by %d, want 2 (priority tag, double tag)", d)
	}
	// The advertisement and at least one SYN; MLD reports may add more.
	if d := after["drop_ipv6"] - before["drop_ipv6"]; d < 2 {
		t.Errorf("drop_ipv6 grew by %d, want at least 2 (advertisement, SYN)", d)
	}
}

// vethMACs returns the MACs of a pod's veth: the node side and eth0.
func vethMACs(t *testing.T, n *testNode, pod ns.NetNS) (host, podMAC net.HardwareAddr) {
	t.Helper()
	h, err := netlink.NewHandleAt(nsHandle(n.nodeNS))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(hostVethName(t, n, pod))
	if err != nil {
		t.Fatal(err)
	}
	in(t, pod, func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err == nil {
			podMAC = eth0.Attrs().HardwareAddr
		}
		return err
	})
	return l.Attrs().HardwareAddr, podMAC
}

// hostVethName names the node side of a pod's eth0.
func hostVethName(t *testing.T, n *testNode, pod ns.NetNS) string {
	t.Helper()
	var peer int
	in(t, pod, func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err == nil {
			peer = eth0.Attrs().ParentIndex
		}
		return err
	})
	for name, idx := range n.nodeLinks() {
		if idx == peer {
			return name
		}
	}
	t.Fatalf("no node link with index %d", peer)
	return ""
}

func inNode(t *testing.T, n *testNode, f func() error) {
	t.Helper()
	in(t, n.nodeNS, f)
}

// linkLocal waits for the IPv6 link-local address of ifName to finish
// duplicate address detection and returns it.
func linkLocal(t *testing.T, netns ns.NetNS, ifName string) netip.Addr {
	t.Helper()
	var out netip.Addr
	deadline := time.Now().Add(5 * time.Second)
	for !out.IsValid() && time.Now().Before(deadline) {
		in(t, netns, func() error {
			l, err := netlink.LinkByName(ifName)
			if err != nil {
				return err
			}
			addrs, err := netlink.AddrList(l, netlink.FAMILY_V6)
			if err != nil {
				return err
			}
			for _, a := range addrs {
				ip, _ := netip.AddrFromSlice(a.IP)
				if ip.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
					out = ip
				}
			}
			return nil
		})
		if !out.IsValid() {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if !out.IsValid() {
		t.Fatalf("%s has no usable IPv6 link-local address", ifName)
	}
	return out
}

func waitLinkLocal(t *testing.T, netns ns.NetNS, ifName string) { linkLocal(t, netns, ifName) }

func ipv6DefaultRoutes(t *testing.T) []string {
	t.Helper()
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() && strings.HasSuffix(r.Dst.String(), "/0") {
			out = append(out, fmt.Sprintf("%v via %v dev %d", r.Dst, r.Gw, r.LinkIndex))
		}
	}
	return out
}

// acceptsRouterAdvertisement sends ra on a plain veth pair between two
// fresh namespaces, the receiving end accepting advertisements, and
// reports whether the receiver gained a default route from it.
func acceptsRouterAdvertisement(t *testing.T, ra func(net.HardwareAddr) []byte) bool {
	t.Helper()
	sender, receiver := testutil.NewNS(t), testutil.NewNS(t)
	var mac net.HardwareAddr
	in(t, receiver, func() error {
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/default/accept_ra", []byte("2"), 0o644); err != nil {
			return err
		}
		return nil
	})
	in(t, sender, func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(receiver.Fd()))}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		mac = l.Attrs().HardwareAddr
		return netlink.LinkSetUp(l)
	})
	in(t, receiver, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	// The receiver must have its own link-local address before it
	// processes advertisements.
	waitLinkLocal(t, receiver, "eth0")
	in(t, sender, func() error { return testutil.SendFrames("eth0", ra(mac)) })
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		var got []string
		in(t, receiver, func() error { got = ipv6DefaultRoutes(t); return nil })
		if len(got) > 0 {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

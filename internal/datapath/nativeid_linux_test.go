package datapath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/weirnet/weir/internal/datapath/bpffs"
	"github.com/weirnet/weir/internal/policy"
	"github.com/weirnet/weir/internal/testutil"
)

// identityOption is the IPv4 option a node puts into natively routed
// packets that open a flow (bpf/lib/nativeid.h).
func identityOption(id uint16) []byte { return []byte{0x9e, 4, byte(id >> 8), byte(id)} }

// routerAlert is an IPv4 option any host may send (RFC 2113).
var routerAlert = []byte{0x94, 4, 0, 0}

// ipv4Options returns the options of the IPv4 header of frame.
func ipv4Options(frame []byte) []byte {
	ihl := int(frame[14]&0xf) * 4
	return frame[14+20 : 14+ihl]
}

// checkIPv4Header fails unless frame's IPv4 header is consistent: its
// checksum sums to zero and its total length covers wantLen bytes.
func checkIPv4Header(t *testing.T, what string, frame []byte, wantLen int) {
	t.Helper()
	ihl := int(frame[14]&0xf) * 4
	if got := testutil.Checksum(frame[14 : 14+ihl]); got != 0 {
		t.Errorf("%s: IPv4 header checksum off by %#04x", what, got)
	}
	if got := int(binary.BigEndian.Uint16(frame[14+2:])); got != wantLen {
		t.Errorf("%s: IPv4 total length %d, want %d", what, got, wantLen)
	}
}

// TestNativeIdentityOptionJudgesNewPods: in native routing, a peer's pod
// whose address has not reached this node is judged by the identity its
// node put into the packet's IPv4 option, from its first packet, and the
// option is gone before the pod sees the packet. Without one it is
// unidentified; the option of a sender that is no peer's pod is never read.
func TestNativeIdentityOptionJudgesNewPods(t *testing.T) {
	p, n, rd := eventNodeMode(t, ModeNative)
	idA, idB := denyAToB(t, n)

	cases := []struct {
		name    string
		src     netip.Addr
		opts    []byte
		want    uint32
		verdict policy.Verdict
		stage   policy.Stage
		peer    policy.Identity
		read    bool
	}{
		{"denied identity in the option", newRemote, identityOption(uint16(idA)), tcActShot, policy.VerdictDeny, policy.StageAdmin, idA, true},
		{"other identity in the option", newRemote, identityOption(uint16(idB)), tcActRedirect, policy.VerdictAllow, policy.StageDefault, idB, true},
		{"other identity, then another option", newRemote, append(identityOption(uint16(idB)), routerAlert...), tcActRedirect, policy.VerdictAllow, policy.StageDefault, idB, true},
		{"no option (ipcache only)", newRemote, nil, tcActShot, policy.VerdictDeny, policy.StageUnidentified, policy.IdentityUnidentified, false},
		{"another option only", newRemote, routerAlert, tcActShot, policy.VerdictDeny, policy.StageUnidentified, policy.IdentityUnidentified, false},
		{"host identity for a pod address", newRemote, identityOption(uint16(policy.IdentityHost)), tcActShot, policy.VerdictDeny, policy.StageUnidentified, policy.IdentityUnidentified, true},
		{"world identity for a pod address", newRemote, identityOption(uint16(policy.IdentityWorld)), tcActShot, policy.VerdictDeny, policy.StageUnidentified, policy.IdentityUnidentified, true},
		// Outside the cluster the option is nobody's word: the sender
		// is judged by its address (world), and the option stays.
		{"an outside sender's option", outside, identityOption(uint16(idA)), tcActRedirect, policy.VerdictAllow, policy.StageDefault, policy.IdentityWorld, false},
	}
	for i, c := range cases {
		base := udpFrame(hostMAC, peerHW, c.src, podB, []byte("payload"))
		binary.BigEndian.PutUint16(base[14+20:], uint16(43000+i))
		frame := base
		if c.opts != nil {
			frame = testutil.IPv4WithOption(base, c.opts)
		}
		readBefore := metric(t, p, "identity_option_read")
		got, out := run(t, p.FromNetdev, frame, 3)
		if got != c.want {
			t.Errorf("%s: verdict %d, want %d", c.name, got, c.want)
			continue
		}
		ev := readEvent(t, rd)
		if ev.Verdict != c.verdict || ev.Stage != c.stage || ev.Peer != c.peer {
			t.Errorf("%s: event verdict %v stage %v peer %d, want %v %v %d", c.name, ev.Verdict, ev.Stage, ev.Peer, c.verdict, c.stage, c.peer)
		}
		if read := metric(t, p, "identity_option_read") - readBefore; read != map[bool]uint64{true: 1}[c.read] {
			t.Errorf("%s: identity_option_read grew by %d", c.name, read)
		}
		if got != tcActRedirect {
			continue
		}
		// What reaches the pod: the identity option stripped, any
		// other option and the payload as sent.
		wantOpts := c.opts
		if c.read {
			wantOpts = c.opts[4:]
		}
		out = out[:len(frame)-(len(c.opts)-len(wantOpts))]
		if !bytes.Equal(ipv4Options(out), wantOpts) || !bytes.Equal(out[len(out)-len(base)+14+20:], base[14+20:]) {
			t.Errorf("%s: delivered options % x and transport % x, want % x and % x", c.name, ipv4Options(out), out[len(out)-len(base)+14+20:], wantOpts, base[14+20:])
		}
		checkIPv4Header(t, c.name, out, len(out)-14)
	}

	// An option of ours whose length is wrong is dropped, never guessed at.
	bad := testutil.IPv4WithOption(udpFrame(hostMAC, peerHW, newRemote, podB, nil), []byte{0x9e, 8, 1, 0, 0, 0, 0, 0})
	before := metric(t, p, "drop_identity_option")
	if got, _ := run(t, p.FromNetdev, bad, 3); got != tcActShot {
		t.Errorf("malformed identity option: verdict %d, want drop", got)
	}
	if d := metric(t, p, "drop_identity_option") - before; d != 1 {
		t.Errorf("drop_identity_option grew by %d, want 1", d)
	}
}

// TestPodCannotForgeIdentityOption: a pod's packet whose first option is
// the node-to-node identity option is dropped and counted, in both modes
// and whatever its destination, since the stack may route it on to a peer
// unchanged (kube-proxy's NAT); other options pass.
func TestPodCannotForgeIdentityOption(t *testing.T) {
	for _, mode := range []Mode{ModeNative, ModeVXLAN} {
		t.Run(string(mode), func(t *testing.T) {
			p := loadTest(t, mode)
			for _, dst := range []netip.Addr{podB, remote, outside} {
				forged := testutil.IPv4WithOption(udpFrame(hostMAC, podMAC, podA, dst, nil), identityOption(uint16(policy.MinClusterIdentity)))
				if got, _ := run(t, p.FromContainer, forged, ifA); got != tcActShot {
					t.Errorf("to %v: a pod's identity option: verdict %d, want drop", dst, got)
				}
			}
			if got := metric(t, p, "drop_identity_option"); got != 3 {
				t.Errorf("drop_identity_option = %d, want 3", got)
			}
			other := testutil.IPv4WithOption(udpFrame(hostMAC, podMAC, podA, podB, nil), routerAlert)
			if got, _ := run(t, p.FromContainer, other, ifA); got != tcActRedirect {
				t.Errorf("a pod's router alert option: verdict %d, want delivered", got)
			}
		})
	}
}

// routedNamespace runs f in a fresh network namespace whose link of
// index ifA routes the remote pod CIDR with the given MTU: the FIB that
// from_container consults in native routing.
func routedNamespace(t *testing.T, mtu int, f func()) {
	t.Helper()
	netns := testutil.NewNS(t)
	err := netns.Do(func(ns.NetNS) error {
		l := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "underlay", Index: ifA, MTU: mtu}, PeerName: "underlay-peer"}
		if err := netlink.LinkAdd(l); err != nil {
			return fmt.Errorf("add the underlay link: %w", err)
		}
		for _, name := range []string{"underlay", "underlay-peer"} {
			if err := netlink.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
				return fmt.Errorf("set %s up: %w", name, err)
			}
		}
		// The FIB answers for forwarding devices only, as on a node.
		if err := os.WriteFile("/proc/sys/net/ipv4/conf/all/forwarding", []byte("1"), 0o644); err != nil {
			return fmt.Errorf("enable forwarding: %w", err)
		}
		_, dst, _ := net.ParseCIDR("10.244.2.0/24")
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: ifA, Dst: dst}); err != nil {
			return fmt.Errorf("route the remote pod CIDR: %w", err)
		}
		f()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestNativeForwardCarriesIdentity: from_container puts the sending pod's
// identity in front of the options of every natively routed packet that
// opens a flow (its first SYN, the first datagram of a UDP flow, a first
// fragment), never into one that continues or retries a flow, a later
// fragment or one the route's MTU has no room for; each leaves with a
// consistent header.
func TestNativeForwardCarriesIdentity(t *testing.T) {
	p, n, _ := eventNodeMode(t, ModeNative)
	res := loadCluster(t, n)
	idA := res.IPCache[podA]
	if idA == 0 {
		t.Fatalf("fixture: pod A has no identity: %v", res.IPCache)
	}
	const mtu = 1500
	withIP := func(frame []byte, f func(ip []byte)) []byte { f(frame[14:]); fixIPv4Checksum(frame); return frame }
	udpFrom := func(sport uint16, payload string) []byte {
		f := udpFrame(hostMAC, podMAC, podA, remote, []byte(payload))
		binary.BigEndian.PutUint16(f[14+20:], sport)
		return f
	}
	fullUDP := udpFrame(hostMAC, podMAC, podA, remote, make([]byte, mtu-28))
	binary.BigEndian.PutUint16(fullUDP[14+20:], 40004)
	fragment := func(offsetWords uint16, more bool, payload string) []byte {
		return withIP(udpFrom(40003, payload), func(ip []byte) {
			binary.BigEndian.PutUint16(ip[4:], 0x5eed) // the datagram's IP id
			if more {
				offsetWords |= 0x2000
			}
			binary.BigEndian.PutUint16(ip[6:], offsetWords)
		})
	}
	cases := []struct {
		name  string
		frame []byte
		opts  []byte // the sender's own options
		stamp bool
	}{
		{"UDP", udpFrom(40001, "q"), nil, true},
		{"UDP, the flow's next datagram", udpFrom(40001, "q2"), nil, false},
		{"UDP with a router alert", udpFrom(40002, "q"), routerAlert, true},
		{"TCP SYN", tcpFrame(hostMAC, podMAC, podA, remote, 41000, 80, 1, tcpSYN, nil), nil, true},
		// A retransmission is judged by the receiver's ipcache: an
		// underlay that drops IPv4 options delays the flow, never stops it.
		{"the SYN retransmitted", tcpFrame(hostMAC, podMAC, podA, remote, 41000, 80, 1, tcpSYN, nil), nil, false},
		{"TCP ACK of that flow", tcpFrame(hostMAC, podMAC, podA, remote, 41000, 80, 2, tcpACK, []byte("GET")), nil, false},
		{"UDP filling the MTU", fullUDP, nil, false},
		{"a first fragment", fragment(0, true, "head-of-datagram"), nil, true},
		{"its later fragment", fragment(2, false, "tail"), nil, false},
	}
	routedNamespace(t, mtu, func() {
		for _, c := range cases {
			frame := c.frame
			if c.opts != nil {
				frame = testutil.IPv4WithOption(frame, c.opts)
			}
			sent := metric(t, p, "identity_option_sent")
			got, out := run(t, p.FromContainer, frame, ifA)
			if got != tcActRedirect {
				t.Errorf("%s: verdict %d, want redirect to the underlay", c.name, got)
				continue
			}
			wantOpts, wantLen := c.opts, len(frame)
			if c.stamp {
				wantOpts, wantLen = append(identityOption(uint16(idA)), c.opts...), len(frame)+4
			}
			out = out[:wantLen]
			if !bytes.Equal(ipv4Options(out), wantOpts) {
				t.Errorf("%s: options % x, want % x", c.name, ipv4Options(out), wantOpts)
			}
			if !bytes.Equal(out[14+20+len(wantOpts):], frame[14+20+len(c.opts):]) {
				t.Errorf("%s: the transport header or payload changed", c.name)
			}
			checkIPv4Header(t, c.name, out, wantLen-14)
			if d := metric(t, p, "identity_option_sent") - sent; d != map[bool]uint64{true: 1}[c.stamp] {
				t.Errorf("%s: identity_option_sent grew by %d", c.name, d)
			}
		}
	})
}

// fixIPv4Checksum recomputes the IPv4 header checksum of frame.
func fixIPv4Checksum(frame []byte) {
	ihl := int(frame[14]&0xf) * 4
	binary.BigEndian.PutUint16(frame[14+10:], 0)
	binary.BigEndian.PutUint16(frame[14+10:], testutil.Checksum(frame[14:14+ihl]))
}

// TestIdentityOptionCanBeTurnedOff: with --identity-option=false (for
// underlays that drop IPv4 options) a flow's first datagram leaves as the
// pod sent it.
func TestIdentityOptionCanBeTurnedOff(t *testing.T) {
	testutil.RequireRoot(t)
	dir := testutil.BPFDir(t)
	if _, err := bpffs.Ensure(dir); err != nil {
		t.Fatal(err)
	}
	p, err := LoadPrograms(ProgramConfig{Mode: ModeNative, PodCIDR: netip.MustParsePrefix("10.244.1.0/24"),
		ClusterCIDR: netip.MustParsePrefix("10.244.0.0/16"), PinDir: dir, senderFromCB: true, NoIdentityOption: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if err := (endpointMap{p.Endpoints}).put(EndpointEntry{Addr: podA, HostIfindex: ifA, PodMAC: podMAC, HostMAC: hostMAC}); err != nil {
		t.Fatal(err)
	}
	if err := (tunnelMap{p.Tunnels}).put(netip.MustParsePrefix("10.244.2.0/24"), ownerNode); err != nil {
		t.Fatal(err)
	}
	frame := udpFrame(hostMAC, podMAC, podA, remote, []byte("q"))
	routedNamespace(t, 1500, func() {
		got, out := run(t, p.FromContainer, frame, ifA)
		if got != tcActRedirect {
			t.Fatalf("verdict %d, want redirect to the underlay", got)
		}
		if !bytes.Equal(out[:len(frame)], frame) || metric(t, p, "identity_option_sent") != 0 {
			t.Errorf("the datagram left changed (% x) or counted as stamped", out[14:14+24])
		}
	})
}

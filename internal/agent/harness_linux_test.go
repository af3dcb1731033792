package agent

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/policy"
	"github.com/weirnet/weir/internal/testutil"
)

// testNode is one node in a throwaway namespace, with a dummy underlay
// device, the real datapath and an in-process agent.
type testNode struct {
	t      *testing.T
	cfg    Config
	nodeNS ns.NetNS
	dp     *datapath.Node
	agent  *Agent
	// ids are the identities of the label sets clientAndServer numbered.
	ids map[string]policy.Identity
}

func newTestNode(t *testing.T, podCIDR string) *testNode {
	t.Helper()
	return newTestNodeMode(t, podCIDR, datapath.ModeVXLAN)
}

// newTestNodeMode is newTestNode in the given routing mode. The underlay
// is eth0 of a veth pair whose other end, eth0peer, stays in the node's
// namespace until a test moves it (see underlayPeer).
func newTestNodeMode(t *testing.T, podCIDR string, mode datapath.Mode) *testNode {
	t.Helper()
	nodeNS := testutil.NewNS(t)
	err := nodeNS.Do(func(ns.NetNS) error {
		// This kernel has no dummy driver: one end of a veth pair serves.
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", MTU: 1500}, PeerName: "eth0peer"}); err != nil {
			return err
		}
		d, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		ipn := &net.IPNet{IP: net.IPv4(10, 99, 0, 11), Mask: net.CIDRMask(24, 32)}
		if err := netlink.AddrAdd(d, &netlink.Addr{IPNet: ipn}); err != nil {
			return err
		}
		return netlink.LinkSetUp(d)
	})
	if err != nil {
		t.Fatalf("underlay: %v", err)
	}
	cfg := Config{
		NodeName: "n1", Mode: mode, UnderlayDev: "eth0",
		NodeIP: netip.MustParseAddr("10.99.0.11"), PodCIDR: netip.MustParsePrefix(podCIDR),
		ClusterCIDR: netip.MustParsePrefix("10.244.0.0/16"),
		StateDir:    t.TempDir(), PinDir: testutil.BPFDir(t),
		Socket:  filepath.Join(t.TempDir(), "agent.sock"),
		FlowDir: t.TempDir(), // kept across a test's restarts, as on a node
	}
	n := &testNode{t: t, cfg: cfg, nodeNS: nodeNS}
	n.start(nil)
	t.Cleanup(n.stop)
	return n
}

// start sets the datapath up (again) and builds an agent over it; wrap,
// when set, puts a fault injector between the agent and the datapath.
func (n *testNode) start(wrap func(Datapath) Datapath) {
	n.t.Helper()
	nc := n.cfg.nodeConfig()
	nc.NetNS = n.nodeNS.Path()
	dp, err := datapath.SetupNode(nc)
	if err != nil {
		n.t.Fatalf("setup node: %v", err)
	}
	n.dp = dp
	var d Datapath = dp
	if wrap != nil {
		d = wrap(dp)
	}
	a, err := New(n.cfg, d, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		n.t.Fatalf("new agent: %v", err)
	}
	n.agent = a
}

// stop drops the agent's handles, as a process exit would, and closes
// its flow store, which the next start opens again.
func (n *testNode) stop() {
	if n.agent != nil {
		n.agent.Close()
	}
	if n.dp != nil {
		n.dp.Close()
		n.dp = nil
	}
}

func (n *testNode) newPod() ns.NetNS { return testutil.NewNS(n.t) }

func addReq(id string, pod ns.NetNS) api.AddRequest {
	return api.AddRequest{Attachment: api.Attachment{ContainerID: id, IfName: "eth0"}, NetNS: pod.Path(), PodNamespace: "default", PodName: id}
}

// nodeLinks returns the pod veths present in the node namespace.
func (n *testNode) nodeLinks() map[string]int {
	n.t.Helper()
	h, err := netlink.NewHandleAt(nsHandle(n.nodeNS))
	if err != nil {
		n.t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		n.t.Fatal(err)
	}
	out := map[string]int{}
	for _, l := range links {
		if datapath.IsHostIfName(l.Attrs().Name) {
			out[l.Attrs().Name] = l.Attrs().Index
		}
	}
	return out
}

// assertClean fails unless no lease, veth, pod route, map entry or link
// pin is left on the node.
func (n *testNode) assertClean(context string) {
	n.t.Helper()
	if l := n.agent.ipam.List(); len(l) != 0 {
		n.t.Fatalf("%s: %d leases left: %+v", context, len(l), l)
	}
	if links := n.nodeLinks(); len(links) != 0 {
		n.t.Fatalf("%s: veths left: %v", context, links)
	}
	entries, err := n.dp.Endpoints()
	if err != nil {
		n.t.Fatal(err)
	}
	if len(entries) != 0 {
		n.t.Fatalf("%s: endpoint map entries left: %+v", context, entries)
	}
	if eps, err := n.dp.PolicyEndpoints(); err != nil || len(eps) != 0 {
		n.t.Fatalf("%s: endpoint policy entries left: %v (%v)", context, eps, err)
	}
	if nss, err := n.dp.TranslatedNetNS(); err != nil || len(nss) != 0 {
		n.t.Fatalf("%s: namespaces still registered for service translation: %v (%v)", context, nss, err)
	}
	pins, _ := os.ReadDir(filepath.Join(n.cfg.PinDir, "links"))
	if len(pins) != 0 {
		n.t.Fatalf("%s: %d link pins left", context, len(pins))
	}
	if routes := n.podRoutes(); len(routes) != 0 {
		n.t.Fatalf("%s: pod routes left: %v", context, routes)
	}
}

// podRoutes lists routes into the pod CIDR other than Weir's own peers.
func (n *testNode) podRoutes() []string {
	h, err := netlink.NewHandleAt(nsHandle(n.nodeNS))
	if err != nil {
		n.t.Fatal(err)
	}
	defer h.Close()
	routes, err := h.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		n.t.Fatal(err)
	}
	var out []string
	for _, r := range routes {
		if r.Dst != nil {
			a, _ := netip.AddrFromSlice(r.Dst.IP.To4())
			if n.cfg.PodCIDR.Contains(a) {
				out = append(out, r.Dst.String())
			}
		}
	}
	return out
}

// podAddr returns the IPv4 addresses of eth0 in a pod (nil if absent).
func podAddr(t *testing.T, pod ns.NetNS) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return nil
		}
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
		for _, a := range addrs {
			ip, _ := netip.AddrFromSlice(a.IP.To4())
			out = append(out, ip)
		}
		return nil
	})
	return out
}

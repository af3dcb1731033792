package agent

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/cni"
	"github.com/weirnet/weir/internal/datapath"
)

// After the agent stops, Uninstall leaves nothing of Weir on the node: no
// pod veth, overlay device, route, masquerade table, pin, attached
// program, CNI config or plugin, state or socket directory; a file of
// someone else's in the state directory stays (and so does the
// directory); a second run finds nothing to do.
func TestUninstallLeavesNothing(t *testing.T) {
	n := newTestNode(t, "10.244.10.0/24")
	pod := n.newPod()
	if _, err := n.agent.Add(addReq("c1", pod)); err != nil {
		t.Fatal(err)
	}
	if err := n.agent.SetPeers([]api.Peer{{Name: "n2", NodeIP: netip.MustParseAddr("10.99.0.12"), PodCIDR: netip.MustParsePrefix("10.244.11.0/24")}}); err != nil {
		t.Fatal(err)
	}
	etc := t.TempDir()
	paths := datapath.UninstallPaths{
		PinDir: n.cfg.PinDir, StateDir: n.cfg.StateDir, Socket: n.cfg.Socket,
		CNIConf: filepath.Join(etc, cni.ConfListName), CNIBinary: filepath.Join(etc, "weir-cni"),
	}
	for _, f := range []string{paths.CNIConf, paths.CNIBinary} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A second state directory, shared with someone else's file.
	shared := t.TempDir()
	for _, f := range []string{"ipam.json", "node.json", "theirs.db"} {
		if err := os.WriteFile(filepath.Join(shared, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	before := n.weirState(t)
	if before.veths == 0 || !before.overlay || before.routes == 0 || !before.masquerade || before.tcx == 0 {
		t.Fatalf("the node was not set up as expected before uninstalling: %+v", before)
	}
	n.stop()
	n.agent = nil // stopped for good: the cleanup's stop has nothing left to close
	var removed []string
	err := n.nodeNS.Do(func(ns.NetNS) (err error) {
		removed, err = datapath.Uninstall(paths)
		return err
	})
	if err != nil {
		t.Fatalf("uninstall: %v (removed %v)", err, removed)
	}
	if after := n.weirState(t); after != (weirState{}) {
		t.Errorf("left after uninstall: %+v (removed %v)", after, removed)
	}
	for _, p := range []string{paths.PinDir, paths.StateDir, paths.Socket, filepath.Dir(paths.Socket), paths.CNIConf, paths.CNIBinary} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still there (%v)", p, err)
		}
	}
	err = n.nodeNS.Do(func(ns.NetNS) error {
		_, err := datapath.Uninstall(datapath.UninstallPaths{StateDir: shared})
		return err
	})
	if left, _ := os.ReadDir(shared); err != nil || len(left) != 1 || left[0].Name() != "theirs.db" {
		t.Errorf("a shared state directory after uninstall: %v, %v; want only theirs.db", left, err)
	}
	err = n.nodeNS.Do(func(ns.NetNS) (err error) {
		removed, err = datapath.Uninstall(paths)
		return err
	})
	if err != nil || len(removed) != 0 {
		t.Errorf("a second uninstall removed %v, %v; want nothing to do", removed, err)
	}
}

// weirState counts what of Weir the node's namespace holds.
type weirState struct {
	veths      int  // pod veths
	overlay    bool // the VXLAN device
	routes     int  // routes of Weir's protocol
	masquerade bool // the nftables table
	tcx        int  // programs attached to the underlay
}

func (n *testNode) weirState(t *testing.T) weirState {
	t.Helper()
	var s weirState
	err := n.nodeNS.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			switch {
			case l.Attrs().Name == datapath.OverlayDevice:
				s.overlay = true
			case datapath.IsHostIfName(l.Attrs().Name):
				s.veths++
			}
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: 0xe8}, netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			return err
		}
		s.routes = len(routes)
		c, err := nftables.New()
		if err != nil {
			return err
		}
		defer c.CloseLasting()
		tables, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
		if err != nil {
			return err
		}
		for _, tb := range tables {
			s.masquerade = s.masquerade || tb.Name == "weir"
		}
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			res, err := link.QueryPrograms(link.QueryOptions{Target: eth0.Attrs().Index, Attach: at})
			if err != nil {
				return err
			}
			s.tcx += len(res.Programs)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

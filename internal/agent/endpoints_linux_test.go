package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
)

func codeOf(err error) uint { return api.CodeOf(err) }

func TestAddCheckDel(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	pod := n.newPod()
	resp, err := n.agent.Add(addReq("c1", pod))
	if err != nil {
		t.Fatalf("add: %v", err)
	}
	if resp.Address != netip.MustParsePrefix("10.244.1.2/32") || resp.Gateway != netip.MustParseAddr("10.244.1.1") {
		t.Fatalf("address %v gateway %v", resp.Address, resp.Gateway)
	}
	if resp.MTU != 1450 {
		t.Fatalf("pod MTU %d, want 1450 (1500 less VXLAN's 50)", resp.MTU)
	}
	if got := podAddr(t, pod); len(got) != 1 || got[0] != resp.Address.Addr() {
		t.Fatalf("pod eth0 addresses %v, want %v", got, resp.Address.Addr())
	}
	if err := n.agent.Check(api.CheckRequest{Attachment: api.Attachment{ContainerID: "c1", IfName: "eth0"}}); err != nil {
		t.Fatalf("check of a healthy attachment: %v", err)
	}
	if links := n.nodeLinks(); len(links) != 1 {
		t.Fatalf("node veths %v, want one", links)
	}
	del := api.DelRequest{Attachment: api.Attachment{ContainerID: "c1", IfName: "eth0"}, NetNS: pod.Path()}
	if err := n.agent.Del(del); err != nil {
		t.Fatalf("del: %v", err)
	}
	n.assertClean("after DEL")
	if got := podAddr(t, pod); len(got) != 0 {
		t.Fatalf("pod still has eth0 with %v", got)
	}
	// DEL is idempotent, also for attachments the agent never saw.
	if err := n.agent.Del(del); err != nil {
		t.Fatalf("second del: %v", err)
	}
	if err := n.agent.Del(api.DelRequest{Attachment: api.Attachment{ContainerID: "never-added", IfName: "eth0"}}); err != nil {
		t.Fatalf("del of unknown container: %v", err)
	}
	err = n.agent.Check(api.CheckRequest{Attachment: api.Attachment{ContainerID: "c1", IfName: "eth0"}})
	if codeOf(err) != api.CodeUnknownContainer {
		t.Fatalf("check after del: %v, want code %d", err, api.CodeUnknownContainer)
	}
}

func TestCheckDetectsBrokenAttachment(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	pod := n.newPod()
	if _, err := n.agent.Add(addReq("c1", pod)); err != nil {
		t.Fatal(err)
	}
	pod.Do(func(ns.NetNS) error {
		l, _ := netlink.LinkByName("eth0")
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
		return netlink.AddrDel(l, &addrs[0])
	})
	err := n.agent.Check(api.CheckRequest{Attachment: api.Attachment{ContainerID: "c1", IfName: "eth0"}})
	if codeOf(err) != api.CodeDatapath {
		t.Fatalf("check of a pod without its address: %v", err)
	}
}

func TestDuplicateAddKeepsFirstAttachment(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	pod := n.newPod()
	first, err := n.agent.Add(addReq("c1", pod))
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.agent.Add(addReq("c1", pod))
	if codeOf(err) != api.CodeAttachmentInUse {
		t.Fatalf("duplicate add: %v, want code %d", err, api.CodeAttachmentInUse)
	}
	if err := n.agent.Check(api.CheckRequest{Attachment: api.Attachment{ContainerID: "c1", IfName: "eth0"}}); err != nil {
		t.Fatalf("first attachment damaged by the duplicate ADD: %v", err)
	}
	if got := podAddr(t, pod); len(got) != 1 || got[0] != first.Address.Addr() {
		t.Fatalf("pod addresses %v after duplicate ADD", got)
	}
}

func TestAddBadInputLeavesNothing(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	cases := []struct {
		name string
		req  func() api.AddRequest
		code uint
	}{
		{"missing netns", func() api.AddRequest {
			return api.AddRequest{Attachment: api.Attachment{ContainerID: "c1", IfName: "eth0"}, NetNS: "/var/run/netns/does-not-exist"}
		}, api.CodeUnknownContainer},
		{"empty netns", func() api.AddRequest {
			return api.AddRequest{Attachment: api.Attachment{ContainerID: "c1", IfName: "eth0"}}
		}, api.CodeInvalidEnv},
		{"interface name too long", func() api.AddRequest {
			r := addReq("c1", n.newPod())
			r.IfName = "a-very-long-interface-name"
			return r
		}, api.CodeInvalidEnv},
		{"interface already in the pod", func() api.AddRequest {
			pod := n.newPod()
			pod.Do(func(ns.NetNS) error {
				return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "other"})
			})
			return addReq("c1", pod)
		}, api.CodeInterfaceExists},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := n.agent.Add(c.req())
			if codeOf(err) != c.code {
				t.Fatalf("err = %v (code %d), want code %d", err, codeOf(err), c.code)
			}
			n.assertClean(c.name)
		})
	}
}

func TestPoolExhaustion(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/29") // 5 pod addresses
	var pods []ns.NetNS
	for i := 0; i < 5; i++ {
		pod := n.newPod()
		pods = append(pods, pod)
		if _, err := n.agent.Add(addReq(fmt.Sprint("c", i), pod)); err != nil {
			t.Fatalf("add %d: %v", i, err)
		}
	}
	_, err := n.agent.Add(addReq("c-extra", n.newPod()))
	if codeOf(err) != api.CodePoolExhausted {
		t.Fatalf("add to a full pool: %v, want code %d", err, api.CodePoolExhausted)
	}
	if links := n.nodeLinks(); len(links) != 5 {
		t.Fatalf("%d veths after a refused ADD, want 5", len(links))
	}
	// Freeing one address makes room again.
	if err := n.agent.Del(api.DelRequest{Attachment: api.Attachment{ContainerID: "c0", IfName: "eth0"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.agent.Add(addReq("c-extra", n.newPod())); err != nil {
		t.Fatalf("add after a release: %v", err)
	}
}

func TestGCReleasesWhatTheRuntimeForgot(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	for i := 0; i < 3; i++ {
		if _, err := n.agent.Add(addReq(fmt.Sprint("c", i), n.newPod())); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := n.agent.GC(api.GCRequest{Valid: []api.Attachment{{ContainerID: "c1", IfName: "eth0"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Released) != 2 {
		t.Fatalf("released %v, want c0 and c2", resp.Released)
	}
	if l := n.agent.ipam.List(); len(l) != 1 || l[0].ContainerID != "c1" {
		t.Fatalf("leases after GC: %+v", l)
	}
	if links := n.nodeLinks(); len(links) != 1 {
		t.Fatalf("veths after GC: %v", links)
	}
	if _, err := n.agent.GC(api.GCRequest{}); err != nil {
		t.Fatal(err)
	}
	n.assertClean("after GC of everything")
}

func TestRestartAdoptsEndpointsWithoutReplumbing(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	keep, gone := n.newPod(), n.newPod()
	if _, err := n.agent.Add(addReq("keep", keep)); err != nil {
		t.Fatal(err)
	}
	if _, err := n.agent.Add(addReq("gone", gone)); err != nil {
		t.Fatal(err)
	}
	before := n.nodeLinks()

	// The agent dies; meanwhile one pod disappears and a half-made veth
	// from an interrupted ADD is lying around.
	n.stop()
	h, _ := netlink.NewHandleAt(nsHandle(n.nodeNS))
	defer h.Close()
	goneName := datapath.HostIfName("gone", "eth0")
	if l, err := h.LinkByName(goneName); err == nil {
		h.LinkDel(l)
	}
	orphan := datapath.HostIfName("orphan", "eth0")
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: orphan}, PeerName: "orphanpeer"}); err != nil {
		t.Fatal(err)
	}

	n.start(nil)
	after := n.nodeLinks()
	keepName := datapath.HostIfName("keep", "eth0")
	if len(after) != 1 || after[keepName] != before[keepName] {
		t.Fatalf("veths after restart %v, want only %s with ifindex %d", after, keepName, before[keepName])
	}
	if l := n.agent.ipam.List(); len(l) != 1 || l[0].ContainerID != "keep" {
		t.Fatalf("leases after restart: %+v", l)
	}
	if entries, _ := n.dp.Endpoints(); len(entries) != 1 {
		t.Fatalf("endpoint map after restart: %+v", entries)
	}
	if err := n.agent.Check(api.CheckRequest{Attachment: api.Attachment{ContainerID: "keep", IfName: "eth0"}}); err != nil {
		t.Fatalf("adopted endpoint: %v", err)
	}
}

// faultyDatapath fails one ADD step, before or after doing it for real.
type faultyDatapath struct {
	Datapath
	step  string
	after bool
}

var errInjected = errors.New("injected fault")

func (f *faultyDatapath) inject(step string, real func() error) error {
	if f.step != step {
		return real()
	}
	if f.after {
		real()
	}
	return errInjected
}

func (f *faultyDatapath) CreateVeth(s datapath.EndpointSpec) (*datapath.Endpoint, error) {
	var ep *datapath.Endpoint
	err := f.inject("create", func() (err error) { ep, err = f.Datapath.CreateVeth(s); return err })
	return ep, err
}
func (f *faultyDatapath) ConfigurePod(ep *datapath.Endpoint) error {
	return f.inject("pod", func() error { return f.Datapath.ConfigurePod(ep) })
}
func (f *faultyDatapath) ConfigureHost(ep *datapath.Endpoint) error {
	return f.inject("host", func() error { return f.Datapath.ConfigureHost(ep) })
}
func (f *faultyDatapath) AttachProgram(ep *datapath.Endpoint) error {
	return f.inject("attach", func() error { return f.Datapath.AttachProgram(ep) })
}
func (f *faultyDatapath) Publish(ep *datapath.Endpoint) error {
	return f.inject("publish", func() error { return f.Datapath.Publish(ep) })
}

var faultSteps = []string{"create", "pod", "host", "attach", "publish"}

// TestAddFaultInjectionStress runs 2,000 ADD/DEL cycles. Each cycle first
// makes an ADD fail at one step (cycling through every step, with the step
// either not done or done and then reported failed), and checks nothing
// is left; then a clean ADD and DEL must succeed and leave nothing either.
func TestAddFaultInjectionStress(t *testing.T) {
	cycles := 2000
	if testing.Short() {
		cycles = 100
	}
	n := newTestNode(t, "10.244.1.0/24")
	fault := &faultyDatapath{}
	n.stop()
	n.start(func(d Datapath) Datapath { fault.Datapath = d; return fault })
	pod := n.newPod()
	injected := map[string]int{}
	for i := 0; i < cycles; i++ {
		fault.step = faultSteps[i%len(faultSteps)]
		fault.after = (i/len(faultSteps))%2 == 1
		if _, err := n.agent.Add(addReq(fmt.Sprint("c", i), pod)); err == nil {
			t.Fatalf("cycle %d: ADD with a fault at %q succeeded", i, fault.step)
		}
		injected[fault.step]++
		n.assertClean(fmt.Sprintf("cycle %d, fault at %s (after=%v)", i, fault.step, fault.after))

		fault.step = ""
		resp, err := n.agent.Add(addReq(fmt.Sprint("c", i), pod))
		if err != nil {
			t.Fatalf("cycle %d: clean ADD: %v", i, err)
		}
		if got := podAddr(t, pod); len(got) != 1 || got[0] != resp.Address.Addr() {
			t.Fatalf("cycle %d: pod has %v, want %v", i, got, resp.Address.Addr())
		}
		if err := n.agent.Del(api.DelRequest{Attachment: api.Attachment{ContainerID: fmt.Sprint("c", i), IfName: "eth0"}}); err != nil {
			t.Fatalf("cycle %d: DEL: %v", i, err)
		}
		n.assertClean(fmt.Sprintf("cycle %d after DEL", i))
	}
	t.Logf("%d cycles; faults injected per step: %v", cycles, injected)
}

// TestTunnelPortAndMTU: a restart with another overlay port and a pod MTU
// replaces the overlay device to match, pods get that MTU, the new port
// is reserved from hostPorts, and an MTU the underlay cannot carry is
// refused at setup.
func TestTunnelPortAndMTU(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	n.stop()
	n.cfg.TunnelPort, n.cfg.MTU = 8472, 1400
	n.start(nil)
	err := n.nodeNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(datapath.OverlayDevice)
		if err != nil {
			return err
		}
		vx, ok := l.(*netlink.Vxlan)
		if !ok || vx.Port != 8472 || vx.MTU != 1400 {
			return fmt.Errorf("overlay %s: port %d MTU %d, want 8472 and 1400", l.Type(), vx.Port, l.Attrs().MTU)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	pod := n.newPod()
	resp, err := n.agent.Add(addReq("c1", pod))
	if err != nil {
		t.Fatal(err)
	}
	if resp.MTU != 1400 {
		t.Errorf("pod MTU %d, want 1400", resp.MTU)
	}
	req := addReq("c2", n.newPod())
	req.PortMappings = []api.PortMapping{{HostPort: 8472, ContainerPort: 53, Protocol: "udp"}}
	if _, err := n.agent.Add(req); codeOf(err) != api.CodeInvalidConfig {
		t.Errorf("hostPort 8472/UDP, the overlay's port: %v, want code %d", err, api.CodeInvalidConfig)
	}

	nc := n.cfg.nodeConfig()
	nc.NetNS, nc.MTU = n.nodeNS.Path(), 1460
	if dp, err := datapath.SetupNode(nc); err == nil {
		dp.Close()
		t.Errorf("MTU 1460 over a 1500-byte underlay in vxlan mode was accepted")
	} else if !strings.Contains(err.Error(), "more than eth0 carries") {
		t.Errorf("MTU 1460: %v, want an error saying eth0 carries less", err)
	}
}

package datapath

import (
	"net/netip"
	"testing"
	"time"

	"github.com/weirnet/weir/internal/policy"
)

// TestEventsNameTheNotedService: a flow the socket layer noted carries its
// frontend into both verdict events (BPF_PROG_RUN); a UDP flow found by
// its client's portless note says so; a note naming another client
// address, or another client's note, names nothing.
func TestEventsNameTheNotedService(t *testing.T) {
	p, n, rd := eventNode(t)
	loadPolicy(t, n, policy.NewCompiler(), nil, policyFixture())
	vip := netip.MustParseAddr("10.96.0.10")
	note := func(client uint32, sport uint16, saddr netip.Addr, vport uint16) {
		t.Helper()
		key := sockLb4FlowKey{Client: client, Daddr: be32(podB), Sport: htons(sport), Dport: htons(7777), Proto: 17}
		val := sockLb4Flow{Vip: be32(vip), Port: htons(vport)}
		if saddr.IsValid() {
			val.Saddr = be32(saddr)
		}
		if err := p.LB4Flows.Put(key, val); err != nil {
			t.Fatal(err)
		}
	}
	note(ifA, 40001, netip.Addr{}, 53)                       // the socket's own note
	note(ifA, 0, netip.Addr{}, 54)                           // a connected UDP socket's portless one
	note(ifA, 40003, netip.MustParseAddr("10.244.1.99"), 55) // another client address
	note(ifB, 40004, netip.Addr{}, 56)                       // another client

	for _, tc := range []struct {
		sport    uint16
		want     netip.AddrPort
		byClient bool
	}{
		{40001, netip.AddrPortFrom(vip, 53), false},
		{40002, netip.AddrPortFrom(vip, 54), true},
		{40003, netip.AddrPort{}, false}, // its own note names another address: none
	} {
		if ret, _ := run(t, p.FromContainer, udpFlow(podA, podB, tc.sport, 7777), ifA); ret != tcActRedirect {
			t.Fatalf("A:%d->B: verdict %d, want redirect", tc.sport, ret)
		}
		for _, dir := range []policy.Direction{policy.Egress, policy.Ingress} {
			ev := readEvent(t, rd)
			if ev.Direction != dir || ev.Src.Port() != tc.sport || ev.Service != tc.want || ev.ServiceByClient != tc.byClient {
				t.Errorf("A:%d->B %v event names service %v (by client %v), want %v (by client %v): %+v",
					tc.sport, dir, ev.Service, ev.ServiceByClient, tc.want, tc.byClient, ev)
			}
		}
	}

	// Without the portless note, another client's note names nothing;
	// nor does a portless note that sockets naming different frontends
	// share.
	key := sockLb4FlowKey{Client: ifA, Daddr: be32(podB), Dport: htons(7777), Proto: 17}
	if err := p.LB4Flows.Delete(key); err != nil {
		t.Fatal(err)
	}
	for _, sport := range []uint16{40004, 40005, 40006} {
		if sport == 40006 {
			if err := p.LB4Flows.Put(key, sockLb4Flow{Vip: be32(vip), Port: htons(54), Flags: 1, Refs: 2}); err != nil {
				t.Fatal(err)
			}
		}
		if ret, _ := run(t, p.FromContainer, udpFlow(podA, podB, sport, 7777), ifA); ret != tcActRedirect {
			t.Fatalf("A:%d->B: verdict %d, want redirect", sport, ret)
		}
		for range 2 {
			if ev := readEvent(t, rd); ev.Service.IsValid() || ev.ServiceByClient {
				t.Errorf("A:%d->B event names service %v (by client %v), want none", sport, ev.Service, ev.ServiceByClient)
			}
		}
	}
}

// TestEventsNameTheNodePortOfAFlowFromOutside: a flow from outside the
// cluster that nodeport.h translated to a local backend names the
// frontend it arrived at (its reply translation), and one that was not
// translated names none.
func TestEventsNameTheNodePortOfAFlowFromOutside(t *testing.T) {
	p := loadTestWith(t, ModeVXLAN, func(c *ProgramConfig) { c.ExternalServices = true })
	n := &Node{progs: p}
	rd, err := n.OpenEventReader()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	loadPolicy(t, n, policy.NewCompiler(), nil, policyFixture())
	client := netip.MustParseAddr("192.0.2.10")
	front := netip.MustParseAddrPort("10.99.0.11:30053")
	rev := hostLb4Tuple{Saddr: be32(podB), Daddr: be32(client), Sport: htons(7777), Dport: htons(40000), Proto: 17}
	if err := p.LB4NatRev.Put(rev, hostLb4Nat{Addr: be32(front.Addr()), Port: htons(front.Port())}); err != nil {
		t.Fatal(err)
	}
	for sport, want := range map[uint16]netip.AddrPort{40000: front, 40001: {}} {
		if ret, _ := run(t, p.ToContainer, udpFlow(client, podB, sport, 7777), ifB); ret != tcActOK {
			t.Fatalf("outside:%d -> B: verdict %d, want pass", sport, ret)
		}
		if ev := readEvent(t, rd); ev.Direction != policy.Ingress || ev.Service != want || ev.ServiceByClient {
			t.Errorf("outside:%d -> B event names %v (by client %v), want %v: %+v", sport, ev.Service, ev.ServiceByClient, want, ev)
		}
	}
}

// TestNodePortForwardIsReported: a new flow from outside that from_netdev
// translates to a backend on another node is reported once, as forwarded,
// naming the client, the backend and the frontend it arrived at (that
// node sees only this node's address). Later packets of the flow (a
// retransmitted SYN too), a flow
// to a local backend (its pod's ingress reports it) and any flow while
// events are off report nothing.
func TestNodePortForwardIsReported(t *testing.T) {
	p := loadTestWith(t, ModeVXLAN, func(c *ProgramConfig) { c.ExternalServices = true })
	n := &Node{progs: p}
	if err := n.SetServices(nodePortTable()); err != nil {
		t.Fatal(err)
	}
	rd, err := n.OpenEventReader()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	send := func(sport, dport uint16, flags uint8) {
		t.Helper()
		frame := tcpFrame(hostMAC, peerHW, outside, nodeAddr, sport, dport, 1, flags, nil)
		if ret, _, _ := runCtx(t, p.FromNetdev, frame, 3); ret != tcActOK {
			t.Fatalf("outside:%d -> NodePort %d: %s, want ok", sport, dport, tcVerdictName(ret))
		}
	}
	// expect reads the next event: the forwarded flow from sport.
	expect := func(sport uint16) {
		t.Helper()
		ev := readEvent(t, rd)
		want := VerdictEvent{Verdict: policy.VerdictForwarded, Direction: policy.Ingress, Proto: 6,
			Src: netip.AddrPortFrom(outside, sport), Dst: netip.AddrPortFrom(remote, 8080),
			Service: netip.AddrPortFrom(nodeAddr, 30081)}
		ev.Time, ev.Peer = time.Time{}, 0
		if ev != want {
			t.Errorf("event %+v, want %+v", ev, want)
		}
	}

	send(40001, 30081, tcpSYN)
	expect(40001)
	send(40001, 30081, tcpSYN) // its SYN retransmitted
	send(40001, 30081, tcpACK) // the same flow
	send(40002, 30080, tcpSYN) // a local backend
	if err := n.SetFlowEvents(false); err != nil {
		t.Fatal(err)
	}
	send(40003, 30081, tcpSYN)
	if err := n.SetFlowEvents(true); err != nil {
		t.Fatal(err)
	}
	send(40004, 30081, tcpSYN)
	expect(40004) // nothing came between
}

package agent

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
)

// TestFlowsNameTheServiceTheClientNamed: a flow record says which Service
// a connection went through when the client named the Service's address,
// for TCP, unconnected UDP and connected UDP, on both the client's and
// the server's record; a connection to the pod address itself names
// none, even from a port a Service connection used before; and the notes
// are gone once the sockets are.
func TestFlowsNameTheServiceTheClientNamed(t *testing.T) {
	n := newTestNode(t, "10.244.12.0/24")
	client, server := n.newPod(), n.newPod()
	sr := n.clientAndServer(client, server, nil)
	serverIP := sr.Address.Addr()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := n.agent.readFlows(ctx, n.dp); err != nil {
		t.Fatal(err)
	}
	serveTCPAndUDP(t, server, 8080, 5353)
	n.applyServices([]*corev1.Service{clusterIPService("web", "10.96.0.10")}, readyEndpoints("web", 8080, 5353, serverIP))

	direct := func(port int) string { return netip.AddrPortFrom(serverIP, uint16(port)).String() }
	// Each step is one flow, told apart by what the client named.
	in(t, client, func() error {
		for _, to := range []string{"10.96.0.10:80", direct(8080)} {
			c, err := net.DialTimeout("tcp4", to, 3*time.Second)
			if err != nil {
				return fmt.Errorf("tcp to %s: %w", to, err)
			}
			if _, err := c.Read(make([]byte, 64)); err != nil {
				return fmt.Errorf("tcp to %s: %w", to, err)
			}
			c.Close()
		}
		// Unconnected UDP: the port is the socket's before sendmsg runs.
		if err := pingUnconnected(netip.MustParseAddrPort("10.96.0.10:53")); err != nil {
			return err
		}
		// Connected UDP: connect() of unbound sockets, two sharing
		// their pod's portless note; the second still names the Service
		// after the first is gone.
		var conns [2]net.Conn
		for i := range conns {
			var err error
			if conns[i], err = net.Dial("udp4", "10.96.0.10:53"); err != nil {
				return err
			}
		}
		for _, c := range conns {
			if err := pingConn(c); err != nil {
				return err
			}
			c.Close()
		}
		// Straight to the pod, once the connected socket is gone.
		return pingUnconnected(netip.AddrPortFrom(serverIP, 5353))
	})

	type want struct {
		dst, proto, service, addr string
		byClient                  bool
		count                     uint64
	}
	wants := []want{
		{direct(8080), "TCP", "default/web", "10.96.0.10:80", false, 1},
		{direct(8080), "TCP", "", "", false, 1},
		{direct(5353), "UDP", "default/web", "10.96.0.10:53", false, 1},
		{direct(5353), "UDP", "default/web", "10.96.0.10:53", true, 2},
		{direct(5353), "UDP", "", "", false, 1},
	}
	for _, pod := range []string{"default/client", "default/server"} {
		var flows []api.Flow
		missing := wants
		for deadline := time.Now().Add(5 * time.Second); len(missing) > 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			var err error
			if flows, err = n.agent.flows.recent(); err != nil {
				t.Fatal(err)
			}
			missing = nil
			for _, w := range wants {
				var count uint64
				for _, f := range flows {
					if f.Pod == pod && f.Verdict == "allowed" && f.Dst == w.dst && f.Proto == w.proto &&
						f.Service == w.service && f.ServiceAddr == w.addr && f.ServiceByClient == w.byClient {
						count += max(f.Count, 1)
					}
				}
				if count != w.count {
					missing = append(missing, w)
				}
			}
		}
		for _, w := range missing {
			t.Errorf("%s: not %d allowed %s flows to %s naming service %q (%q, by client %v); flows: %+v", pod, w.count, w.proto, w.dst, w.service, w.addr, w.byClient, flowsOf(flows))
		}
	}

	// Every socket is closed: the notes went with them.
	deadline := time.Now().Add(5 * time.Second)
	for {
		notes, err := n.dp.MapEntries(datapath.MapServiceFlows, 0)
		if err != nil {
			t.Fatal(err)
		}
		if notes == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d service flow notes left after every socket closed", notes)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pingUnconnected sends "ping" to to from a fresh unconnected UDP socket
// and waits for the answer.
func pingUnconnected(to netip.AddrPort) error {
	u, err := net.ListenPacket("udp4", ":0")
	if err != nil {
		return err
	}
	defer u.Close()
	if _, err := u.WriteTo([]byte("ping"), net.UDPAddrFromAddrPort(to)); err != nil {
		return fmt.Errorf("udp to %s: %w", to, err)
	}
	_ = u.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, _, err := u.ReadFrom(make([]byte, 64)); err != nil {
		return fmt.Errorf("udp to %s: %w", to, err)
	}
	return nil
}

// pingConn sends "ping" on a connected socket and waits for the answer.
func pingConn(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	_, err := c.Read(make([]byte, 64))
	return err
}

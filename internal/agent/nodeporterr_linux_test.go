package agent

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// serveUDPEcho sends each datagram back whole.
func serveUDPEcho(pc net.PacketConn) {
	buf := make([]byte, 65536)
	for {
		k, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		_, _ = pc.WriteTo(buf[:k], from)
	}
}

// TestNodePortFragmentsAndICMPErrorsFromOutsideHost: through a UDP
// NodePort, with no kube-proxy, a host outside the cluster gets a 4,000
// byte datagram echoed whole (it leaves fragmented, and the echo comes
// back fragmented: every fragment follows its first), and a backend pod
// with nothing listening answers with a port unreachable the client's
// socket takes as its own (ECONNREFUSED at once, not a silent timeout).
func TestNodePortFragmentsAndICMPErrorsFromOutsideHost(t *testing.T) {
	n := newReplacingNode(t, "10.244.1.0/24")
	far, _ := underlayPeer(t, n, netip.MustParseAddr("10.99.0.50"))
	server := n.newPod()
	sr, err := n.agent.Add(addReq("server", server))
	if err != nil {
		t.Fatal(err)
	}
	var pc net.PacketConn
	in(t, server, func() (err error) { pc, err = net.ListenPacket("udp4", ":5353"); return err })
	t.Cleanup(func() { pc.Close() })
	go serveUDPEcho(pc)

	echo := clusterIPService("echo", "10.96.0.90")
	echo.Spec.Type = corev1.ServiceTypeNodePort
	echo.Spec.Ports[0].NodePort, echo.Spec.Ports[1].NodePort = 30090, 30053
	deaf := clusterIPService("deaf", "10.96.0.91")
	deaf.Spec.Type = corev1.ServiceTypeNodePort
	deaf.Spec.Ports[0].NodePort, deaf.Spec.Ports[1].NodePort = 30091, 30056
	n.applyServices([]*corev1.Service{echo, deaf},
		readyEndpoints("echo", 8080, 5353, sr.Address.Addr()), readyEndpoints("deaf", 8080, 5999, sr.Address.Addr()))

	in(t, far, func() error {
		c, err := net.Dial("udp4", "10.99.0.11:30053")
		if err != nil {
			return err
		}
		defer c.Close()
		big := bytes.Repeat([]byte("0123456789abcdef"), 250)
		if _, err := c.Write(big); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 8192)
		k, err := c.Read(buf)
		if err != nil {
			return fmt.Errorf("a 4,000 byte datagram through the NodePort: no echo: %w", err)
		}
		if !bytes.Equal(buf[:k], big) {
			t.Errorf("echo of %d bytes, want the 4,000 sent", k)
		}

		d, err := net.Dial("udp4", "10.99.0.11:30056")
		if err != nil {
			return err
		}
		defer d.Close()
		if _, err := d.Write([]byte("anyone?")); err != nil {
			return err
		}
		start := time.Now()
		_ = d.SetReadDeadline(time.Now().Add(3 * time.Second))
		if _, err := d.Read(buf); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("a backend with nothing listening: %v after %v, want ECONNREFUSED (its port unreachable, translated)", err, time.Since(start))
		}
		return nil
	})
}

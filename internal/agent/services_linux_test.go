package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/service"
)

// in runs f with the calling thread in pod's namespace: sockets made there
// belong to the pod.
func in(t *testing.T, pod ns.NetNS, f func() error) {
	t.Helper()
	if err := pod.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}

// serveTCP accepts on ln and writes each client's address back.
func serveTCP(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = c.Write([]byte(c.RemoteAddr().String()))
		c.Close()
	}
}

// serveTCPAndUDP serves serveTCP on tcpPort and serveUDP on udpPort in
// pod until the test ends.
func serveTCPAndUDP(t *testing.T, pod ns.NetNS, tcpPort, udpPort int) {
	t.Helper()
	var ln net.Listener
	var pc net.PacketConn
	in(t, pod, func() (err error) {
		if ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", tcpPort)); err != nil {
			return err
		}
		if pc, err = net.ListenPacket("udp4", fmt.Sprintf(":%d", udpPort)); err != nil {
			ln.Close()
		}
		return err
	})
	t.Cleanup(func() { ln.Close(); pc.Close() })
	go serveTCP(ln)
	go serveUDP(pc)
}

// serveUDP answers each datagram with "pong".
func serveUDP(pc net.PacketConn) {
	buf := make([]byte, 64)
	for {
		_, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		_, _ = pc.WriteTo([]byte("pong"), from)
	}
}

func TestSocketTranslatesServiceAddresses(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	client, server, other := n.newPod(), n.newPod(), n.newPod()
	cr, err := n.agent.Add(addReq("client", client))
	if err != nil {
		t.Fatal(err)
	}
	sr, err := n.agent.Add(addReq("server", server))
	if err != nil {
		t.Fatal(err)
	}
	serverIP := sr.Address.Addr()
	serveTCPAndUDP(t, server, 8080, 5353)

	vip := netip.MustParseAddr("10.96.0.10")
	table := service.Table{
		{Addr: vip, Port: 80, Proto: service.ProtoTCP}: {Backends: []service.Backend{{Addr: serverIP, Port: 8080}}},
		{Addr: vip, Port: 53, Proto: service.ProtoUDP}: {Backends: []service.Backend{{Addr: serverIP, Port: 5353}}},
	}
	if err := n.dp.SetServices(table); err != nil {
		t.Fatal(err)
	}
	if got, err := n.dp.Services(); err != nil || !reflect.DeepEqual(got, table) {
		t.Fatalf("service maps read back %v (%v), want %v", got, err, table)
	}

	t.Run("tcp connect goes to the backend and the peer shows the ClusterIP", func(t *testing.T) {
		var c net.Conn
		in(t, client, func() (err error) {
			c, err = net.DialTimeout("tcp4", "10.96.0.10:80", 3*time.Second)
			return err
		})
		defer c.Close()
		// Go fills RemoteAddr from getpeername().
		if c.RemoteAddr().String() != "10.96.0.10:80" {
			t.Errorf("getpeername = %v, want the ClusterIP 10.96.0.10:80", c.RemoteAddr())
		}
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 64)
		k, err := c.Read(buf)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		// The server saw the client's own address: no NAT on the path.
		if from, _, _ := net.SplitHostPort(string(buf[:k])); from != cr.Address.Addr().String() {
			t.Errorf("server saw client %q, want %v", buf[:k], cr.Address.Addr())
		}
	})

	t.Run("unconnected udp: sent to the backend, reply from the ClusterIP", func(t *testing.T) {
		in(t, client, func() error {
			u, err := net.ListenPacket("udp4", ":0")
			if err != nil {
				return err
			}
			defer u.Close()
			if _, err := u.WriteTo([]byte("ping"), &net.UDPAddr{IP: net.IPv4(10, 96, 0, 10), Port: 53}); err != nil {
				return err
			}
			_ = u.SetReadDeadline(time.Now().Add(3 * time.Second))
			buf := make([]byte, 64)
			k, from, err := u.ReadFrom(buf)
			if err != nil {
				return err
			}
			if string(buf[:k]) != "pong" || from.String() != "10.96.0.10:53" {
				t.Errorf("reply %q from %v, want pong from 10.96.0.10:53", buf[:k], from)
			}
			return nil
		})
	})

	t.Run("sockets outside this node's pods are left alone", func(t *testing.T) {
		// other is a namespace with no Weir attachment and no route to the
		// ClusterIP: untranslated, the connect has nowhere to go.
		in(t, other, func() error {
			_, err := net.DialTimeout("tcp4", "10.96.0.10:80", time.Second)
			if !errors.Is(err, syscall.ENETUNREACH) {
				t.Errorf("dial from a foreign namespace: %v, want ENETUNREACH (untranslated)", err)
			}
			return nil
		})
	})

	if m, err := n.dp.Metrics(); err != nil || m["sock_lb"] < 2 {
		t.Errorf("sock_lb = %d (%v), want at least 2", m["sock_lb"], err)
	}

	t.Run("resize and delete keep the maps exact", func(t *testing.T) {
		bigger := service.Table{
			{Addr: vip, Port: 80, Proto: service.ProtoTCP}: {Backends: []service.Backend{{Addr: serverIP, Port: 8080}, {Addr: serverIP, Port: 8081}, {Addr: serverIP, Port: 8082}}},
		}
		for _, want := range []service.Table{bigger, table, {}} {
			if err := n.dp.SetServices(want); err != nil {
				t.Fatal(err)
			}
			got, err := n.dp.Services()
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("service maps read back %v (%v), want %v", got, err, want)
			}
		}
	})

	for _, id := range []string{"client", "server"} {
		if err := n.agent.Del(api.DelRequest{Attachment: api.Attachment{ContainerID: id, IfName: "eth0"}}); err != nil {
			t.Fatal(err)
		}
	}
	if nss, err := n.dp.TranslatedNetNS(); err != nil || len(nss) != 0 {
		t.Fatalf("translated namespaces after DEL: %v (%v), want none", nss, err)
	}
}

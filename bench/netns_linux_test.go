package main

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/weirnet/weir/internal/testutil"
)

// probeNS is a namespace with loopback up: the probe's sockets must be
// made inside it, where nothing outside can answer.
func probeNS(t *testing.T) ns.NetNS {
	t.Helper()
	n := testutil.NewNS(t)
	err := n.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		t.Fatalf("loopback up: %v", err)
	}
	return n
}

// openSockets counts the process's sockets once the count settles (the
// echo server closes its end after the client's, on its own goroutine).
// Other descriptors (the runtime's poller, splice's cached pipes) are not
// the probe's.
func openSockets(t *testing.T, atMost int) int {
	t.Helper()
	n := 0
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		n = 0
		for _, e := range ents {
			if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); strings.HasPrefix(l, "socket:") {
				n++
			}
		}
		if n <= atMost || time.Now().After(deadline) {
			return n
		}
	}
}

// The prober keeps trying while the port refuses, connects once a
// listener appears (inside the namespace, not the test's), reports a time
// no earlier than that, and hands over a working connection.
func TestFirstReachableConnectsOnceOpen(t *testing.T) {
	n := probeNS(t)
	echo := newEchoServer(n.Path())
	defer echo.close()
	const port = 18080
	before := openSockets(t, 1<<30)
	opened := make(chan time.Time, 1)
	go func() {
		time.Sleep(100 * time.Millisecond)
		at := time.Now()
		if err := echo.listen(port); err != nil {
			t.Error(err)
		}
		opened <- at
	}()
	conn, at, err := firstReachable(context.Background(), n.Path(), "127.0.0.1:18080", time.Millisecond, 5*time.Second)
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	defer conn.Close()
	if open := <-opened; at.Before(open) {
		t.Errorf("reported connected at %v, before the listener opened at %v", at, open)
	}
	if _, err := conn.Write([]byte{7}); err != nil {
		t.Fatal(err)
	}
	buf := []byte{0}
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(conn, buf); err != nil || buf[0] != 7 {
		t.Fatalf("echo over the probe's connection: %v %v", buf, err)
	}
	conn.Close()
	echo.close()
	if after := openSockets(t, before); after > before {
		t.Errorf("%d sockets open after the probe, %d before: attempts leaked", after, before)
	}
	// The root namespace never had the listener: the same probe from
	// here must not find it.
	if c, err := net.DialTimeout("tcp", "127.0.0.1:18080", 100*time.Millisecond); err == nil {
		c.Close()
		t.Error("the listener is reachable from the root namespace: the probe did not run inside")
	}
}

// A peer that never answers (as behind a policy drop: the SYN goes
// unanswered) or a port that refuses ends in errNeverReachable at the
// limit, with every attempt closed.
func TestFirstReachableGivesUp(t *testing.T) {
	n := probeNS(t)
	// 10.1.1.2 is on a link where nobody answers ARP: each attempt hangs
	// until the prober drops it.
	err := n.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "probe0"}, PeerName: "probe1"}); err != nil {
			return err
		}
		l, err := netlink.LinkByName("probe0")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 1, 1, 1), Mask: net.CIDRMask(24, 32)}}); err != nil {
			return err
		}
		peer, err := netlink.LinkByName("probe1")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(peer); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatalf("silent link: %v", err)
	}
	before := openSockets(t, 1<<30)
	for _, addr := range []string{"10.1.1.2:80", "127.0.0.1:18081"} {
		_, _, err := firstReachable(context.Background(), n.Path(), addr, time.Millisecond, 200*time.Millisecond)
		if !errors.Is(err, errNeverReachable) {
			t.Fatalf("probe of %s: %v, want errNeverReachable", addr, err)
		}
		if after := openSockets(t, before); after > before {
			t.Errorf("%s: %d sockets open after the probe, %d before: attempts leaked", addr, after, before)
		}
	}
	if _, _, err := firstReachable(context.Background(), n.Path(), "[::1]:80", time.Millisecond, time.Second); err == nil {
		t.Error("an IPv6 address was accepted; the prober dials IPv4 only")
	}
}

package agent

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/service"
)

// newReplacingNode is a test node whose agent runs with no kube-proxy
// beside it (--kube-proxy-replacement).
func newReplacingNode(t *testing.T, podCIDR string) *testNode {
	t.Helper()
	n := newTestNode(t, podCIDR)
	n.stop()
	n.cfg.KubeProxyReplacement = true
	n.cfg.HealthCheckNodePortAddr = "127.0.0.1" // the test process's namespace: loopback only
	n.start(nil)
	return n
}

// clusterIPService is a ClusterIP Service "web" in namespace "default" with
// one TCP port 80 → targetPort "http" and one UDP port 53 → "dns".
func clusterIPService(name, ip string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP},
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
		}},
	}
}

// readyEndpoints is svc's EndpointSlice: every address ready, each port
// listening on the given target numbers.
func readyEndpoints(svc string, httpPort, dnsPort int32, addrs ...netip.Addr) *discoveryv1.EndpointSlice {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	httpName, dnsName := "http", "dns"
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: svc + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: &httpName, Port: &httpPort, Protocol: &tcp},
			{Name: &dnsName, Port: &dnsPort, Protocol: &udp},
		},
	}
	ready := true
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return s
}

// applyServices makes svcs and slices the cluster's Services, as the
// watcher's updates would: one update per Service, and a deletion for
// each Service applied before that is not among svcs.
func (n *testNode) applyServices(svcs []*corev1.Service, slices ...*discoveryv1.EndpointSlice) {
	n.t.Helper()
	n.applyServicesOn(nil, svcs, slices...)
}

// applyServicesOn is applyServices in a cluster of nodes.
func (n *testNode) applyServicesOn(nodes []k8s.Node, svcs []*corev1.Service, slices ...*discoveryv1.EndpointSlice) {
	n.t.Helper()
	bySvc := service.GroupSlices(slices)
	var updates []k8s.ServiceUpdate
	n.agent.mu.Lock()
	defer n.agent.mu.Unlock()
	gone := map[string]bool{}
	for _, k := range n.agent.serviceCacheLocked().Keys() {
		gone[k] = true
	}
	for _, svc := range svcs {
		key := service.Key(svc.Namespace, svc.Name)
		delete(gone, key)
		updates = append(updates, k8s.ServiceUpdate{Key: key, Service: svc, Slices: bySvc[key]})
	}
	for k := range gone {
		updates = append(updates, k8s.ServiceUpdate{Key: k})
	}
	n.agent.syncServicesLocked(nodes, updates)
	if !n.agent.services.applied {
		n.t.Fatal("services not programmed")
	}
}

// metric reads one datapath counter.
func (n *testNode) metric(name string) uint64 {
	n.t.Helper()
	m, err := n.dp.Metrics()
	if err != nil {
		n.t.Fatal(err)
	}
	return m[name]
}

// serveNamed accepts on ln and writes name to each client.
func serveNamed(ln net.Listener, name string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = c.Write([]byte(name))
		c.Close()
	}
}

// listenIn opens, in pod, a TCP listener on tcpPort that serve answers
// and, unless udpPort is 0, a UDP socket on udpPort that answers "pong";
// both close when the test ends.
func listenIn(t *testing.T, pod ns.NetNS, tcpPort int, serve func(net.Listener), udpPort int) {
	t.Helper()
	var (
		ln net.Listener
		pc net.PacketConn
	)
	in(t, pod, func() (err error) {
		if ln, err = net.Listen("tcp4", ":"+strconv.Itoa(tcpPort)); err != nil || udpPort == 0 {
			return err
		}
		pc, err = net.ListenPacket("udp4", ":"+strconv.Itoa(udpPort))
		return err
	})
	t.Cleanup(func() { ln.Close() })
	go serve(ln)
	if pc != nil {
		t.Cleanup(func() { pc.Close() })
		go serveUDP(pc)
	}
}

// dialRead connects to addr and returns what the server wrote.
func dialRead(addr string) (string, error) {
	c, err := net.DialTimeout("tcp4", addr, 3*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 64)
	k, err := c.Read(buf)
	if err != nil {
		return "", fmt.Errorf("read from %s: %w", addr, err)
	}
	return string(buf[:k]), nil
}

// TestServiceWithoutBackendsRefusesAtOnce: with no kube-proxy beside the
// agent, a Service without a ready endpoint answers a new TCP connection,
// a connected UDP socket and an unconnected datagram with ECONNREFUSED at
// once (kube-proxy's REJECT), from a pod and from the node itself; beside
// kube-proxy the same Service is left untranslated for kube-proxy.
func TestServiceWithoutBackendsRefusesAtOnce(t *testing.T) {
	n := newReplacingNode(t, "10.244.1.0/24")
	client := n.newPod()
	if _, err := n.agent.Add(addReq("client", client)); err != nil {
		t.Fatal(err)
	}
	n.applyServices([]*corev1.Service{clusterIPService("empty", "10.96.0.20")}, readyEndpoints("empty", 80, 53))

	refused := func(where string) func() error {
		return func() error {
			start := time.Now()
			_, err := net.DialTimeout("tcp4", "10.96.0.20:80", 3*time.Second)
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("%s: tcp connect to a Service without backends: %v, want ECONNREFUSED", where, err)
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("%s: refused after %v, want at once", where, took)
			}
			if _, err := net.Dial("udp4", "10.96.0.20:53"); !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("%s: udp connect: %v, want ECONNREFUSED", where, err)
			}
			u, err := net.ListenPacket("udp4", ":0")
			if err != nil {
				return err
			}
			defer u.Close()
			if _, err := u.WriteTo([]byte("q"), &net.UDPAddr{IP: net.IPv4(10, 96, 0, 20), Port: 53}); !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("%s: udp sendto: %v, want ECONNREFUSED", where, err)
			}
			return nil
		}
	}
	st, err := n.agent.Status()
	if err != nil {
		t.Fatal(err)
	}
	if sv := st.Services; sv == nil || sv.Frontends != 2 || sv.Refusing != 2 || sv.Backends != 0 || !sv.KubeProxyReplacement {
		t.Errorf("status services %+v, want 2 frontends, both refusing", st.Services)
	}
	if l, err := n.agent.ServiceList(); err != nil || len(l.Frontends) != 2 || l.Frontends[0].State != "refusing" || l.Frontends[0].Service != "default/empty" {
		t.Errorf("service list %+v (%v), want both frontends of default/empty refusing", l, err)
	}
	before := n.metric("sock_lb_reject")
	in(t, client, refused("pod"))
	in(t, n.nodeNS, refused("node"))
	if got := n.metric("sock_lb_reject") - before; got != 6 {
		t.Errorf("sock_lb_reject rose by %d, want 6 (3 sockets from the pod, 3 from the node)", got)
	}

	// Beside kube-proxy the frontend is not written: kube-proxy answers.
	n.stop()
	n.cfg.KubeProxyReplacement = false
	n.start(nil)
	n.applyServices([]*corev1.Service{clusterIPService("empty", "10.96.0.20")}, readyEndpoints("empty", 80, 53))
	if got, err := n.dp.Services(); err != nil || len(got) != 0 {
		t.Errorf("beside kube-proxy the service maps hold %v (%v), want nothing", got, err)
	}
	if nss, err := n.dp.TranslatedNetNS(); err != nil || len(nss) != 1 {
		t.Errorf("beside kube-proxy translated namespaces %v (%v), want the pod's alone", nss, err)
	}
}

// TestNodeOwnSocketsReachServices: with no kube-proxy, the node's own
// processes (and so hostNetwork pods) reach a ClusterIP: the connect is
// sent to a backend pod and getpeername shows the ClusterIP.
func TestNodeOwnSocketsReachServices(t *testing.T) {
	n := newReplacingNode(t, "10.244.1.0/24")
	server := n.newPod()
	sr, err := n.agent.Add(addReq("server", server))
	if err != nil {
		t.Fatal(err)
	}
	listenIn(t, server, 8080, func(ln net.Listener) { serveNamed(ln, "server") }, 0)
	n.applyServices([]*corev1.Service{clusterIPService("web", "10.96.0.30")}, readyEndpoints("web", 8080, 5353, sr.Address.Addr()))

	in(t, n.nodeNS, func() error {
		c, err := net.DialTimeout("tcp4", "10.96.0.30:80", 3*time.Second)
		if err != nil {
			return fmt.Errorf("the node's own connect to a ClusterIP: %w", err)
		}
		defer c.Close()
		if c.RemoteAddr().String() != "10.96.0.30:80" {
			t.Errorf("getpeername = %v, want the ClusterIP", c.RemoteAddr())
		}
		return nil
	})
	l, err := n.agent.ServiceList()
	if err != nil {
		t.Fatal(err)
	}
	want := []api.ServiceFrontend{
		{Addr: netip.MustParseAddr("10.96.0.30"), Port: 53, Protocol: "UDP", Service: "default/web", State: "serving",
			Backends: []api.ServiceBackend{{Addr: sr.Address.Addr(), Port: 5353}}},
		{Addr: netip.MustParseAddr("10.96.0.30"), Port: 80, Protocol: "TCP", Service: "default/web", State: "serving",
			Backends: []api.ServiceBackend{{Addr: sr.Address.Addr(), Port: 8080}}},
	}
	if !l.InSync || !l.KubeProxyReplacement || !reflect.DeepEqual(l.Frontends, want) {
		t.Errorf("service list %+v, want in sync, no kube-proxy, frontends %+v", l, want)
	}
	nss, err := n.dp.TranslatedNetNS()
	if err != nil {
		t.Fatal(err)
	}
	own := 0
	for _, ifindex := range nss {
		if ifindex == 0 {
			own++
		}
	}
	if own != 1 {
		t.Errorf("translated namespaces %v: want the node's own (host ifindex 0) once", nss)
	}
}

// TestSessionAffinityKeepsClientOnBackend: a sessionAffinity: ClientIP
// Service sends every connection of a client to one backend while the
// client keeps coming back within the timeout; after the timeout the
// client picks afresh; when its backend goes, it moves to one that
// serves. The same Service without affinity spreads over its backends.
func TestSessionAffinityKeepsClientOnBackend(t *testing.T) {
	n := newReplacingNode(t, "10.244.1.0/24")
	client, server := n.newPod(), n.newPod()
	if _, err := n.agent.Add(addReq("client", client)); err != nil {
		t.Fatal(err)
	}
	sr, err := n.agent.Add(addReq("server", server))
	if err != nil {
		t.Fatal(err)
	}
	serverIP := sr.Address.Addr()
	// Four backends: the server pod on four ports, each answering with its
	// port.
	ports := []int32{8080, 8081, 8082, 8083}
	for _, p := range ports {
		name := strconv.Itoa(int(p))
		listenIn(t, server, int(p), func(ln net.Listener) { serveNamed(ln, name) }, 0)
	}
	slicesFor := func(ps ...int32) []*discoveryv1.EndpointSlice {
		var out []*discoveryv1.EndpointSlice
		for i, p := range ps {
			s := readyEndpoints("web", p, 53, serverIP)
			s.Name = fmt.Sprintf("web-%d", i)
			out = append(out, s)
		}
		return out
	}
	web := clusterIPService("web", "10.96.0.40")
	web.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	// Long enough that no pause of a loaded machine ends it.
	timeout := int32(60)
	web.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}
	n.applyServices([]*corev1.Service{web}, slicesFor(ports...)...)

	seen := func(conns int) map[string]int {
		out := map[string]int{}
		in(t, client, func() error {
			for range conns {
				got, err := dialRead("10.96.0.40:80")
				if err != nil {
					return err
				}
				out[got]++
			}
			return nil
		})
		return out
	}
	fresh, affine := n.metric("sock_lb"), n.metric("sock_lb_affinity")
	got := seen(20)
	if len(got) != 1 {
		t.Fatalf("20 connections of one client went to %v, want one backend", got)
	}
	if f, a := n.metric("sock_lb")-fresh, n.metric("sock_lb_affinity")-affine; f != 1 || a != 19 {
		t.Errorf("picks: %d fresh and %d by affinity, want 1 and 19", f, a)
	}
	var kept string
	for k := range got {
		kept = k
	}

	// The client's backend goes: it moves to one that serves, and stays.
	var rest []int32
	for _, p := range ports {
		if strconv.Itoa(int(p)) != kept {
			rest = append(rest, p)
		}
	}
	n.applyServices([]*corev1.Service{web}, slicesFor(rest...)...)
	got = seen(10)
	if len(got) != 1 || got[kept] != 0 {
		t.Errorf("after backend %s went, connections went to %v, want one other backend", kept, got)
	}

	// With a timeout of one second, a client that comes back later than
	// that picks afresh.
	timeout = 1
	n.applyServices([]*corev1.Service{web}, slicesFor(rest...)...)
	seen(1)
	time.Sleep(1500 * time.Millisecond)
	fresh = n.metric("sock_lb")
	seen(1)
	if f := n.metric("sock_lb") - fresh; f != 1 {
		t.Errorf("after the timeout: %d fresh picks, want 1", f)
	}

	// Without affinity, the same client spreads over the backends.
	web.Spec.SessionAffinity, web.Spec.SessionAffinityConfig = corev1.ServiceAffinityNone, nil
	n.applyServices([]*corev1.Service{web}, slicesFor(ports...)...)
	if got := seen(40); len(got) < 2 {
		t.Errorf("40 connections without affinity all went to %v, want several backends", got)
	}
	if m, err := n.dp.MapEntries("affinity_members", 0); err != nil || m != 0 {
		t.Errorf("affinity members left after affinity was turned off: %d (%v)", m, err)
	}
}

// mapped is the IPv4-mapped IPv6 form of a (::ffff:a.b.c.d).
func mapped(a netip.Addr) [16]byte { return netip.AddrFrom16(a.As16()).As16() }

// TestMappedIPv6SocketsAreTranslated: an AF_INET6 socket that names a
// ClusterIP as ::ffff:a.b.c.d (the JVM's default) is translated like an
// AF_INET one: its TCP connect reaches the backend with getpeername
// showing the mapped ClusterIP, an unconnected UDP reply comes from the
// mapped ClusterIP, and a Service without backends is refused at once.
func TestMappedIPv6SocketsAreTranslated(t *testing.T) {
	n := newReplacingNode(t, "10.244.1.0/24")
	client, server := n.newPod(), n.newPod()
	if _, err := n.agent.Add(addReq("client", client)); err != nil {
		t.Fatal(err)
	}
	sr, err := n.agent.Add(addReq("server", server))
	if err != nil {
		t.Fatal(err)
	}
	listenIn(t, server, 8080, func(ln net.Listener) { serveNamed(ln, "server") }, 5353)
	n.applyServices([]*corev1.Service{clusterIPService("web", "10.96.0.50"), clusterIPService("empty", "10.96.0.51")},
		readyEndpoints("web", 8080, 5353, sr.Address.Addr()), readyEndpoints("empty", 80, 53))
	vip := mapped(netip.MustParseAddr("10.96.0.50"))

	in(t, client, func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Connect(fd, &unix.SockaddrInet6{Port: 80, Addr: vip}); err != nil {
			return fmt.Errorf("connect to [::ffff:10.96.0.50]:80: %w", err)
		}
		peer, err := unix.Getpeername(fd)
		if err != nil {
			return err
		}
		if p, ok := peer.(*unix.SockaddrInet6); !ok || p.Addr != vip || p.Port != 80 {
			t.Errorf("getpeername = %+v, want [::ffff:10.96.0.50]:80", peer)
		}
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 3})
		buf := make([]byte, 16)
		k, err := unix.Read(fd, buf)
		if err != nil || string(buf[:max(k, 0)]) != "server" {
			t.Errorf("read %q (%v), want the backend's answer", buf[:max(k, 0)], err)
		}
		return nil
	})

	in(t, client, func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Sendto(fd, []byte("ping"), 0, &unix.SockaddrInet6{Port: 53, Addr: vip}); err != nil {
			return fmt.Errorf("sendto [::ffff:10.96.0.50]:53: %w", err)
		}
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 3})
		buf := make([]byte, 16)
		k, from, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return fmt.Errorf("no reply: %w", err)
		}
		if f, ok := from.(*unix.SockaddrInet6); string(buf[:k]) != "pong" || !ok || f.Addr != vip || f.Port != 53 {
			t.Errorf("reply %q from %+v, want pong from [::ffff:10.96.0.50]:53", buf[:k], from)
		}
		return nil
	})

	in(t, client, func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		err = unix.Connect(fd, &unix.SockaddrInet6{Port: 80, Addr: mapped(netip.MustParseAddr("10.96.0.51"))})
		if !errors.Is(err, unix.ECONNREFUSED) {
			t.Errorf("connect to a mapped Service without backends: %v, want ECONNREFUSED", err)
		}
		return nil
	})
}

// serveEcho echoes each client's bytes back until it closes.
func serveEcho(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}

// echoes writes msg on c and reads it back.
func echoes(c net.Conn, msg string) error {
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, 64)
	k, err := c.Read(buf)
	if err != nil {
		return err
	}
	if got := string(buf[:k]); got != msg && got != "pong" {
		return fmt.Errorf("read %q, want %q", got, msg)
	}
	return nil
}

// TestRemovedBackendClosesItsSockets: when a Service's backend is taken
// away, the sockets its clients connected through the Service to it, TCP
// and connected UDP, fail with ECONNABORTED at once instead of talking to
// an address the Service no longer sends anyone to, and the client's next
// connect reaches the backend that replaced it. A connection made to the
// pod address directly is not the Service's and stays.
func TestRemovedBackendClosesItsSockets(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24") // beside kube-proxy: pods' sockets are translated all the same
	client, server := n.newPod(), n.newPod()
	if _, err := n.agent.Add(addReq("client", client)); err != nil {
		t.Fatal(err)
	}
	sr, err := n.agent.Add(addReq("server", server))
	if err != nil {
		t.Fatal(err)
	}
	serverIP := sr.Address.Addr()
	for _, port := range []int{8080, 8081} {
		listenIn(t, server, port, serveEcho, port)
	}
	web := clusterIPService("web", "10.96.0.60")
	n.applyServices([]*corev1.Service{web}, readyEndpoints("web", 8080, 8080, serverIP))

	var viaService, viaUDP, direct net.Conn
	in(t, client, func() (err error) {
		if viaService, err = net.DialTimeout("tcp4", "10.96.0.60:80", 3*time.Second); err != nil {
			return err
		}
		if viaUDP, err = net.Dial("udp4", "10.96.0.60:53"); err != nil {
			return err
		}
		direct, err = net.DialTimeout("tcp4", net.JoinHostPort(serverIP.String(), "8080"), 3*time.Second)
		return err
	})
	defer viaService.Close()
	defer viaUDP.Close()
	defer direct.Close()
	for name, c := range map[string]net.Conn{"tcp via the Service": viaService, "udp via the Service": viaUDP, "tcp to the pod": direct} {
		if err := echoes(c, "before"); err != nil {
			t.Fatalf("%s before the change: %v", name, err)
		}
	}

	closed := n.metric("sock_lb_closed")
	// The endpoint now serves on 8081: the 8080 backend is gone.
	n.applyServices([]*corev1.Service{web}, readyEndpoints("web", 8081, 8081, serverIP))
	start := time.Now()
	if err := echoes(viaService, "after"); !errors.Is(err, syscall.ECONNABORTED) {
		t.Errorf("tcp via the Service after its backend went: %v, want ECONNABORTED", err)
	}
	// A UDP client waits in recv: it is woken with the error. The socket
	// is disconnected too, so a send says it has no destination.
	_ = viaUDP.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := viaUDP.Read(make([]byte, 64)); !errors.Is(err, syscall.ECONNABORTED) {
		t.Errorf("udp via the Service after its backend went: recv %v, want ECONNABORTED", err)
	}
	if _, err := viaUDP.Write([]byte("after")); !errors.Is(err, syscall.EDESTADDRREQ) {
		t.Errorf("udp via the Service after its backend went: send %v, want EDESTADDRREQ (disconnected)", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("the sockets failed after %v, want at once", took)
	}
	if err := echoes(direct, "after"); err != nil {
		t.Errorf("the connection made to the pod address was touched: %v", err)
	}
	if got := n.metric("sock_lb_closed") - closed; got != 2 {
		t.Errorf("sock_lb_closed rose by %d, want 2", got)
	}
	in(t, client, func() error {
		c, err := net.DialTimeout("tcp4", "10.96.0.60:80", 3*time.Second)
		if err != nil {
			return fmt.Errorf("reconnect: %w", err)
		}
		defer c.Close()
		if err := echoes(c, "again"); err != nil {
			return fmt.Errorf("reconnect: %w", err)
		}
		return nil
	})
}

// TestNodePortAtTheSocket: with no kube-proxy, a NodePort Service is
// reached from a pod and from the node itself at this node's address and
// at another node's, each connect sent straight to a backend, with
// getpeername showing the address the client named; the same port at an
// address that is no node's is left alone; a UDP socket connected to
// another node's NodePort is closed when its backend goes.
func TestNodePortAtTheSocket(t *testing.T) {
	n := newReplacingNode(t, "10.244.1.0/24")
	client, server := n.newPod(), n.newPod()
	if _, err := n.agent.Add(addReq("client", client)); err != nil {
		t.Fatal(err)
	}
	sr, err := n.agent.Add(addReq("server", server))
	if err != nil {
		t.Fatal(err)
	}
	listenIn(t, server, 8080, func(ln net.Listener) { serveNamed(ln, "server") }, 5353)
	web := clusterIPService("web", "10.96.0.70")
	web.Spec.Type = corev1.ServiceTypeNodePort
	web.Spec.Ports[0].NodePort, web.Spec.Ports[1].NodePort = 30080, 30053
	other := k8s.Node{Name: "n2", InternalIP: netip.MustParseAddr("10.99.0.12")}
	n.applyServicesOn([]k8s.Node{other}, []*corev1.Service{web}, readyEndpoints("web", 8080, 5353, sr.Address.Addr()))

	for _, where := range []struct {
		name string
		ns   ns.NetNS
	}{{"pod", client}, {"node", n.nodeNS}} {
		for _, addr := range []string{"10.99.0.11:30080", "10.99.0.12:30080"} {
			in(t, where.ns, func() error {
				c, err := net.DialTimeout("tcp4", addr, 3*time.Second)
				if err != nil {
					return fmt.Errorf("%s to NodePort %s: %w", where.name, addr, err)
				}
				defer c.Close()
				if c.RemoteAddr().String() != addr {
					t.Errorf("%s to %s: getpeername %v, want the NodePort", where.name, addr, c.RemoteAddr())
				}
				return nil
			})
		}
	}
	// kube-proxy's localhost NodePorts: the node's own processes reach
	// the NodePort at 127.0.0.1 too; a pod's loopback stays its own,
	// where nothing listens on the port.
	in(t, n.nodeNS, func() error {
		c, err := net.DialTimeout("tcp4", "127.0.0.1:30080", 3*time.Second)
		if err != nil {
			return fmt.Errorf("node to the NodePort at localhost: %w", err)
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		if b, err := io.ReadAll(c); err != nil || string(b) != "server" {
			t.Errorf("node to the NodePort at localhost: read %q, %v; want the backend's name", b, err)
		}
		return nil
	})
	in(t, client, func() error {
		c, err := net.DialTimeout("tcp4", "127.0.0.1:30080", 3*time.Second)
		if err == nil {
			c.Close()
			t.Errorf("a pod's connect to its own localhost:30080 reached %v, want its own loopback (refused)", c.RemoteAddr())
		} else if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("a pod's connect to its own localhost:30080: %v, want ECONNREFUSED from its own loopback", err)
		}
		return nil
	})
	// The NodePort's number at an address that is no node's: no
	// translation (the SYN goes nowhere).
	translated := n.metric("sock_lb")
	in(t, client, func() error {
		if c, err := net.DialTimeout("tcp4", "10.99.0.77:30080", 300*time.Millisecond); err == nil {
			c.Close()
			t.Errorf("a connect to 10.99.0.77:30080, no node's address, reached %v", c.RemoteAddr())
		}
		return nil
	})
	if got := n.metric("sock_lb") - translated; got != 0 {
		t.Errorf("a connect to no node's address was translated (%d)", got)
	}
	l, err := n.agent.ServiceList()
	if err != nil {
		t.Fatal(err)
	}
	// ClusterIP TCP and UDP, NodePort TCP and UDP at every node's address
	// (one entry each) and at localhost for sockets, and at this node's
	// for packets from outside.
	if len(l.Frontends) != 8 {
		t.Errorf("service list: %+v, want 8 frontends", l.Frontends)
	}

	// A socket sent through the any-node entry is closed with its
	// backend, as one sent through a ClusterIP is.
	var u net.Conn
	in(t, client, func() (err error) {
		u, err = net.Dial("udp4", "10.99.0.12:30053")
		return err
	})
	defer u.Close()
	ping := func() error {
		if _, err := u.Write([]byte("ping")); err != nil {
			return err
		}
		_ = u.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 16)
		_, err := u.Read(buf)
		return err
	}
	if err := ping(); err != nil {
		t.Fatalf("udp to another node's NodePort: %v", err)
	}
	n.applyServicesOn([]k8s.Node{other}, []*corev1.Service{web}, readyEndpoints("web", 8080, 5353))
	_ = u.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := u.Read(make([]byte, 16)); !errors.Is(err, syscall.ECONNABORTED) {
		t.Errorf("udp to another node's NodePort after its backend went: recv %v, want ECONNABORTED", err)
	}
	if err := ping(); !errors.Is(err, syscall.EDESTADDRREQ) {
		t.Errorf("udp to another node's NodePort after its backend went: send %v, want EDESTADDRREQ (disconnected)", err)
	}
}

// TestNodePortFromOutsideHost: with no kube-proxy, a host outside the
// cluster reaches a NodePort at the node's address: over TCP the backend
// pod sees the client's own address (its backend is local) and the client
// sees the NodePort answer; over UDP the reply comes from the NodePort; an
// externalTrafficPolicy: Local NodePort with no endpoint on this node
// drops (the connect times out); one with no endpoint at all is refused at
// once.
func TestNodePortFromOutsideHost(t *testing.T) {
	n := newReplacingNode(t, "10.244.1.0/24")
	outsideAddr := netip.MustParseAddr("10.99.0.50")
	far, _ := underlayPeer(t, n, outsideAddr)
	server := n.newPod()
	sr, err := n.agent.Add(addReq("server", server))
	if err != nil {
		t.Fatal(err)
	}
	listenIn(t, server, 8080, serveTCP, 5353)

	web := clusterIPService("web", "10.96.0.80")
	web.Spec.Type = corev1.ServiceTypeNodePort
	web.Spec.Ports[0].NodePort, web.Spec.Ports[1].NodePort = 30080, 30053
	local := clusterIPService("local", "10.96.0.81")
	local.Spec.Type = corev1.ServiceTypeNodePort
	local.Spec.Ports[0].NodePort, local.Spec.Ports[1].NodePort = 30081, 30054
	local.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	empty := clusterIPService("empty", "10.96.0.82")
	empty.Spec.Type = corev1.ServiceTypeNodePort
	empty.Spec.Ports[0].NodePort, empty.Spec.Ports[1].NodePort = 30082, 30055
	elsewhere := readyEndpoints("local", 8080, 5353, netip.MustParseAddr("10.244.2.9"))
	node2 := "n2"
	elsewhere.Endpoints[0].NodeName = &node2
	n.applyServices([]*corev1.Service{web, local, empty}, readyEndpoints("web", 8080, 5353, sr.Address.Addr()), elsewhere, readyEndpoints("empty", 80, 53))

	in(t, far, func() error {
		got, err := dialRead("10.99.0.11:30080")
		if err != nil {
			return fmt.Errorf("outside host to the NodePort: %w", err)
		}
		if from, _, _ := net.SplitHostPort(got); from != outsideAddr.String() {
			t.Errorf("the backend saw the client as %q, want its own address %v", got, outsideAddr)
		}
		u, err := net.ListenPacket("udp4", ":0")
		if err != nil {
			return err
		}
		defer u.Close()
		if _, err := u.WriteTo([]byte("ping"), &net.UDPAddr{IP: net.IPv4(10, 99, 0, 11), Port: 30053}); err != nil {
			return err
		}
		_ = u.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 16)
		k, from, err := u.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("udp NodePort: no reply: %w", err)
		}
		if string(buf[:k]) != "pong" || from.String() != "10.99.0.11:30053" {
			t.Errorf("udp reply %q from %v, want pong from the NodePort", buf[:k], from)
		}

		start := time.Now()
		if _, err := net.DialTimeout("tcp4", "10.99.0.11:30081", time.Second); err == nil || errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("externalTrafficPolicy: Local, no endpoint here: %v, want a timeout (dropped)", err)
		}
		if _, err := net.DialTimeout("tcp4", "10.99.0.11:30082", 3*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("NodePort without endpoints: %v, want ECONNREFUSED", err)
		}
		if took := time.Since(start); took > 2500*time.Millisecond {
			t.Errorf("the refusal took %v", took)
		}
		return nil
	})
	for _, m := range []string{"nodeport_new", "nodeport_reply", "drop_nodeport"} {
		if n.metric(m) == 0 {
			t.Errorf("metric %s is 0", m)
		}
	}
}

// TestHealthCheckNodePortFollowsEndpoints: with no kube-proxy, the agent
// answers an externalTrafficPolicy: Local LoadBalancer Service's health
// check node port from the cluster's state: 200 with this node's ready
// endpoint, 503 once it is gone.
func TestHealthCheckNodePortFollowsEndpoints(t *testing.T) {
	n := newReplacingNode(t, "10.244.1.0/24")
	lb := clusterIPService("lb", "10.96.0.90")
	lb.Spec.Type = corev1.ServiceTypeLoadBalancer
	lb.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	lb.Spec.HealthCheckNodePort = int32(freePort(t))
	here := readyEndpoints("lb", 8080, 5353, netip.MustParseAddr("10.244.1.9"))
	node := "n1"
	here.Endpoints[0].NodeName = &node
	n.applyServices([]*corev1.Service{lb}, here)
	if code, body := probe(t, uint16(lb.Spec.HealthCheckNodePort)); code != 200 || body["localEndpoints"] != float64(1) {
		t.Errorf("with a local endpoint: %d %v, want 200 and 1", code, body)
	}
	n.applyServices([]*corev1.Service{lb}, readyEndpoints("lb", 8080, 5353))
	if code, _ := probe(t, uint16(lb.Spec.HealthCheckNodePort)); code != 503 {
		t.Errorf("without a local endpoint: %d, want 503", code)
	}
}

// TestHostPort: with no kube-proxy, a pod's hostPort (the runtime's
// portMappings) is reached at the node's address from a host outside the
// cluster (the client's address kept) and from the node itself; one with
// hostIP 127.0.0.1 from the node's own processes alone, beside another
// pod's same port at the node's address; its DEL takes the port away
// (refused, nothing left in the maps); a mapping the agent cannot serve
// fails the ADD, naming it.
func TestHostPort(t *testing.T) {
	n := newReplacingNode(t, "10.244.1.0/24")
	far, _ := underlayPeer(t, n, netip.MustParseAddr("10.99.0.50"))
	pod := n.newPod()
	req := addReq("web", pod)
	req.PortMappings = []api.PortMapping{{HostPort: 30900, ContainerPort: 8080, Protocol: "tcp"}, {HostPort: 30901, ContainerPort: 5353, Protocol: "udp"}}
	if _, err := n.agent.Add(req); err != nil {
		t.Fatal(err)
	}
	listenIn(t, pod, 8080, serveTCP, 5353)

	in(t, far, func() error {
		got, err := dialRead("10.99.0.11:30900")
		if err != nil {
			return fmt.Errorf("outside host to the hostPort: %w", err)
		}
		if from, _, _ := net.SplitHostPort(got); from != "10.99.0.50" {
			t.Errorf("the pod saw the client as %q, want 10.99.0.50", got)
		}
		c, err := net.Dial("udp4", "10.99.0.11:30901")
		if err != nil {
			return err
		}
		defer c.Close()
		if err := echoes(c, "ping"); err != nil {
			t.Errorf("udp hostPort from outside: %v", err)
		}
		return nil
	})
	in(t, n.nodeNS, func() error {
		if _, err := dialRead("10.99.0.11:30900"); err != nil {
			t.Errorf("the node to its own hostPort: %v", err)
		}
		return nil
	})

	// The same port at 127.0.0.1, another pod's: the node's processes
	// reach it there; nothing from outside can address it.
	local := n.newPod()
	localReq := addReq("local", local)
	localReq.PortMappings = []api.PortMapping{{HostPort: 30900, ContainerPort: 8080, Protocol: "tcp", HostIP: "127.0.0.1"}}
	lr, err := n.agent.Add(localReq)
	if err != nil {
		t.Fatal(err)
	}
	listenIn(t, local, 8080, serveTCP, 0)
	in(t, n.nodeNS, func() error {
		if _, err := dialRead("127.0.0.1:30900"); err != nil {
			t.Errorf("the node to the hostPort at 127.0.0.1: %v", err)
		}
		return nil
	})
	if svcs, err := n.dp.Services(); err != nil {
		t.Fatal(err)
	} else {
		loopback := 0
		for f, e := range svcs {
			if f.Addr != service.Loopback {
				continue
			}
			loopback++
			if f.External || len(e.Backends) != 1 || e.Backends[0].Addr != lr.Address.Addr() {
				t.Errorf("hostPort at 127.0.0.1: %v -> %v, want for sockets alone, to the pod", f, e.Backends)
			}
		}
		if loopback != 1 {
			t.Errorf("%d frontends at 127.0.0.1, want the hostPort's one for sockets", loopback)
		}
	}
	if err := n.agent.Del(api.DelRequest{Attachment: localReq.Attachment}); err != nil {
		t.Fatal(err)
	}

	if err := n.agent.Del(api.DelRequest{Attachment: req.Attachment}); err != nil {
		t.Fatal(err)
	}
	if got, err := n.dp.Services(); err != nil || len(got) != 0 {
		t.Errorf("after DEL the service maps hold %v (%v), want nothing", got, err)
	}
	in(t, far, func() error {
		if _, err := net.DialTimeout("tcp4", "10.99.0.11:30900", 3*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("the hostPort after DEL: %v, want ECONNREFUSED", err)
		}
		return nil
	})

	bad := addReq("bad", n.newPod())
	bad.PortMappings = []api.PortMapping{{HostPort: 30902, ContainerPort: 80, Protocol: "sctp"}}
	if _, err := n.agent.Add(bad); err == nil || !strings.Contains(err.Error(), "sctp") {
		t.Errorf("ADD with an SCTP hostPort: %v, want an error naming the protocol", err)
	}
	resolver := addReq("resolver", n.newPod())
	resolver.PortMappings = []api.PortMapping{{HostPort: 53, ContainerPort: 53, Protocol: "udp", HostIP: "10.0.0.2"}}
	if _, err := n.agent.Add(resolver); err == nil || !strings.Contains(err.Error(), "neither this node's address") {
		t.Errorf("ADD with a hostPort on another host's address: %v, want an error", err)
	}
	tunnel := addReq("tunnel", n.newPod())
	tunnel.PortMappings = []api.PortMapping{{HostPort: 4789, ContainerPort: 4789, Protocol: "udp"}}
	if _, err := n.agent.Add(tunnel); err == nil || !strings.Contains(err.Error(), "overlay") {
		t.Errorf("ADD with hostPort 4789/udp: %v, want an error: the overlay's port", err)
	}
}

// TestSocketLBOffLeavesEveryServiceToKubeProxy: with --socket-lb=false the
// service maps stay empty whatever the Services, so a pod's connect to a
// ClusterIP is left for kube-proxy's rules, and the list says why.
func TestSocketLBOffLeavesEveryServiceToKubeProxy(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	n.stop()
	n.cfg.NoSocketLB = true
	n.start(nil)
	client, server := n.newPod(), n.newPod()
	if _, err := n.agent.Add(addReq("client", client)); err != nil {
		t.Fatal(err)
	}
	sr, err := n.agent.Add(addReq("server", server))
	if err != nil {
		t.Fatal(err)
	}
	n.applyServices([]*corev1.Service{clusterIPService("web", "10.96.0.30")}, readyEndpoints("web", 8080, 5353, sr.Address.Addr()))
	if got, err := n.dp.Services(); err != nil || len(got) != 0 {
		t.Errorf("with the socket LB off the service maps hold %v (%v), want nothing", got, err)
	}
	l, err := n.agent.ServiceList()
	if err != nil {
		t.Fatal(err)
	}
	if !l.SocketLBOff || !l.InSync || len(l.Frontends) != 0 {
		t.Errorf("service list %+v, want the socket LB off, in sync, no frontends", l)
	}
	before := n.metric("sock_lb")
	in(t, client, func() error {
		c, err := net.Dial("udp4", "10.96.0.30:53")
		if err != nil {
			return err
		}
		defer c.Close()
		if c.RemoteAddr().String() != "10.96.0.30:53" {
			t.Errorf("connected to %v, want the ClusterIP untranslated", c.RemoteAddr())
		}
		return nil
	})
	if got := n.metric("sock_lb") - before; got != 0 {
		t.Errorf("sock_lb rose by %d, want 0: nothing is translated with the socket LB off", got)
	}
}

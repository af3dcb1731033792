package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/policy"
	"github.com/weirnet/weir/internal/testutil"
)

// egressHTTPNode starts pods client and server on one node, the
// client's egress restricted to HTTP rules on port 80 (as a
// WeirNetworkPolicy says it), the server's ingress open; it returns the
// server's address.
func egressHTTPNode(t *testing.T, n *testNode, client, server ns.NetNS, rules []l7.Rule) netip.Addr {
	t.Helper()
	nsLabels := map[string]string{"kubernetes.io/metadata.name": "default"}
	pods := []k8s.Pod{
		{Namespace: "default", Name: "client", Labels: map[string]string{"app": "client"}, NodeName: "n1"},
		{Namespace: "default", Name: "server", Labels: map[string]string{"app": "server"}, NodeName: "n1"},
	}
	port := intstr.FromInt32(80)
	tcp := corev1.ProtocolTCP
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "client-http"}}
	np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}
	np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}}}
	ids := map[string]policy.Identity{}
	for _, p := range pods {
		key := policy.IdentityLabels(policy.Namespace{Name: "default", Labels: nsLabels}, p.Labels).Key()
		ids[key] = policy.MinClusterIdentity + policy.Identity(len(ids))
	}
	n.agent.snapshot = func() (k8s.Snapshot, bool) {
		return k8s.Snapshot{
			Namespaces: map[string]map[string]string{"default": nsLabels},
			Pods:       pods, ClusterPods: pods, Identities: ids,
			Policies: []*networkingv1.NetworkPolicy{np},
			HTTP:     map[*networkingv1.NetworkPolicy]*policy.PolicyHTTP{np: {Egress: [][][]l7.Rule{{rules}}}},
		}, true
	}
	if _, err := n.agent.Add(addReq("client", client)); err != nil {
		t.Fatal(err)
	}
	sr, err := n.agent.Add(addReq("server", server))
	if err != nil {
		t.Fatal(err)
	}
	return sr.Address.Addr()
}

// pathsServer serves HTTP on ln, answering "<method> <path>" and
// remembering what it served.
type pathsServer struct {
	mu   sync.Mutex
	seen []string
}

func (s *pathsServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	s.mu.Lock()
	s.seen = append(s.seen, r.Method+" "+r.URL.Path)
	s.mu.Unlock()
	fmt.Fprintf(w, "%s %s", r.Method, r.URL.Path)
}

func (s *pathsServer) served() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.seen, "\n")
}

// TestEgressHTTPOnTheClientsSocket: through real pods, a client whose
// egress policy allows port 80 only through HTTP rules has each request
// judged on its own socket: an allowed one reaches the server, a denied
// one is answered 403 in the server's place and never leaves the pod,
// and the keep-alive connection goes on. A segment the pod forges on the
// connection from a raw socket, with the exact sequence numbers the
// server expects next, is dropped at the pod's veth (drop_l7_unjudged):
// only bytes the socket's verdict judged leave. The requests are in the
// flows as the client's egress verdicts.
func TestEgressHTTPOnTheClientsSocket(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	client, server := n.newPod(), n.newPod()
	srv := egressHTTPNode(t, n, client, server, []l7.Rule{
		{Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/public"}},
	})
	// The server takes Fast Open (a case below needs a client that
	// holds a cookie).
	var ln net.Listener
	in(t, server, func() (err error) {
		if err := os.WriteFile("/proc/sys/net/ipv4/tcp_fastopen", []byte("3"), 0); err != nil {
			return err
		}
		lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_FASTOPEN, 16) }); err != nil {
				return err
			}
			return serr
		}}
		ln, err = lc.Listen(context.Background(), "tcp4", ":80")
		return err
	})
	defer ln.Close()
	paths := &pathsServer{}
	go http.Serve(ln, paths)

	var c net.Conn
	in(t, client, func() (err error) { c, err = net.Dial("tcp4", srv.String()+":80"); return err })
	defer c.Close()
	ask := func(req string) string {
		t.Helper()
		if _, err := c.Write([]byte(req)); err != nil {
			t.Fatalf("write %q: %v", req, err)
		}
		buf := make([]byte, 4096)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		k, _ := c.Read(buf)
		return string(buf[:k])
	}
	if got := ask("GET /public/a HTTP/1.1\r\nHost: server\r\n\r\n"); !strings.Contains(got, "200 OK") || !strings.HasSuffix(got, "GET /public/a") {
		t.Fatalf("allowed request: %q, want it served", got)
	}
	if got := ask("PUT /v1/exhaust-port HTTP/1.1\r\nHost: server\r\nContent-Length: 4\r\n\r\nboom"); !strings.HasPrefix(got, "HTTP/1.1 403 Forbidden\r\n") {
		t.Fatalf("denied request: %q, want a 403", got)
	}
	if got := ask("GET /public/b HTTP/1.1\r\nHost: server\r\n\r\n"); !strings.HasSuffix(got, "GET /public/b") {
		t.Fatalf("allowed request after the denial: %q, want it served", got)
	}

	// A forged segment: the bytes the server expects next, from a raw
	// socket of the same pod.
	before, err := n.dp.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	seq, ack := repairSeqs(t, c)
	forged := "PUT /v1/exhaust-port HTTP/1.1\r\nHost: server\r\nContent-Length: 0\r\n\r\n"
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	in(t, client, func() error {
		return sendRawTCP(local, netip.AddrPortFrom(srv, 80), seq, ack, []byte(forged))
	})
	time.Sleep(300 * time.Millisecond)
	if s := paths.served(); strings.Contains(s, "PUT") {
		t.Fatalf("the server served a forged request: %q", s)
	}
	after, err := n.dp.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if after["drop_l7_unjudged"] == before["drop_l7_unjudged"] {
		t.Error("drop_l7_unjudged did not grow: the forged segment was not dropped as unjudged")
	}
	// The connection itself is unharmed: its own next request is judged
	// and served (its bytes start where the forged ones would have).
	if got := ask("GET /public/c HTTP/1.1\r\nHost: server\r\n\r\n"); !strings.HasSuffix(got, "GET /public/c") {
		t.Fatalf("allowed request after the forgery: %q, want it served", got)
	}
	if s := paths.served(); s != "GET /public/a\nGET /public/b\nGET /public/c" {
		t.Fatalf("the server served %q, want the three allowed requests", s)
	}

	// A forged segment over judged bytes that have not left yet: the
	// socket's next request is judged and queued but held (repair mode
	// holds it here, as a closed window or a slow path would), and the
	// pod sends other bytes in the same sequence range first. The mark
	// lets that range out: the socket's cookie is what stops them.
	before, err = n.dp.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	allowed, swapped := "GET /public/f HTTP/1.1\r\nHost: server\r\n\r\n", "PUT /public/f HTTP/1.1\r\nHost: server\r\n\r\n"
	seq, ack = repairSeqs(t, c)
	holdSend(t, c, allowed)
	in(t, client, func() error {
		return sendRawTCP(local, netip.AddrPortFrom(srv, 80), seq, ack, []byte(swapped))
	})
	time.Sleep(300 * time.Millisecond)
	if s := paths.served(); strings.Contains(s, "PUT") {
		t.Fatalf("the server served a request forged over judged bytes: %q", s)
	}
	if after, err = n.dp.Metrics(); err != nil {
		t.Fatal(err)
	}
	if after["drop_l7_unjudged"] == before["drop_l7_unjudged"] {
		t.Error("drop_l7_unjudged did not grow: the segment forged over judged bytes was not dropped")
	}
	// Let go, the held request is sent again by TCP and served.
	for deadline := time.Now().Add(5 * time.Second); !strings.HasSuffix(paths.served(), "GET /public/f"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the held request was never served: %q", paths.served())
		}
	}

	// A Fast Open connect with a cookie: the first write sends its bytes
	// on the SYN, and TCP sends them again itself after the handshake,
	// never through the verdict. They are above the judged mark: they
	// never leave, and the next send closes the connection. (The first
	// connection only fetches the cookie; its request is judged.)
	before, err = n.dp.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	fastOpen := func(reqs ...string) error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_FASTOPEN_CONNECT, 1); err != nil {
			return err
		}
		if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: srv.As4(), Port: 80}); err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		for i, req := range reqs {
			if i > 0 {
				time.Sleep(1500 * time.Millisecond) // past the SYN's retransmission
			}
			if _, err := unix.Write(fd, []byte(req)); err != nil {
				return fmt.Errorf("write %d: %w", i, err)
			}
		}
		return nil
	}
	in(t, client, func() error { return fastOpen("GET /public/cookie HTTP/1.1\r\nHost: server\r\n\r\n") })
	time.Sleep(200 * time.Millisecond)
	in(t, client, func() error {
		err := fastOpen("GET /public/d HTTP/1.1\r\nHost: server\r\n\r\n", "GET /public/e HTTP/1.1\r\nHost: server\r\n\r\n")
		if !errors.Is(err, syscall.EACCES) {
			t.Errorf("a send after bytes TCP sent unjudged: %v, want EACCES on the second write (the connection closed)", err)
		}
		return nil
	})
	if s := paths.served(); strings.Contains(s, "/public/d") || strings.Contains(s, "/public/e") {
		t.Fatalf("the server served %q: bytes no verdict judged left the pod", s)
	}
	after, err = n.dp.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if after["drop_l7_unjudged"] == before["drop_l7_unjudged"] {
		t.Error("drop_l7_unjudged did not grow: the Fast Open bytes were not held at the judged mark")
	}
}

// The queues of TCP_REPAIR_QUEUE (linux/tcp.h), which x/sys/unix lacks.
const (
	tcpRecvQueue = 1
	tcpSendQueue = 2
)

// inRepair runs f on c's socket in TCP repair mode (root only), which
// it leaves after, with f's queue chosen.
func inRepair(t *testing.T, c net.Conn, f func(fd int) error) {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ferr error
	err = rc.Control(func(fd uintptr) {
		s := int(fd)
		if ferr = unix.SetsockoptInt(s, unix.IPPROTO_TCP, unix.TCP_REPAIR, 1); ferr != nil {
			return
		}
		defer unix.SetsockoptInt(s, unix.IPPROTO_TCP, unix.TCP_REPAIR, 0)
		ferr = f(s)
	})
	if err != nil || ferr != nil {
		t.Fatalf("in repair mode: %v %v", err, ferr)
	}
}

// queueSeq reads the next sequence number of a queue of a socket in
// repair mode: to send (tcpSendQueue) or to receive (tcpRecvQueue).
func queueSeq(fd, queue int) (uint32, error) {
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, queue); err != nil {
		return 0, err
	}
	v, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ)
	return uint32(v), err
}

// repairSeqs reads a connected socket's next sequence number to send and
// to receive.
func repairSeqs(t *testing.T, c net.Conn) (seq, ack uint32) {
	t.Helper()
	inRepair(t, c, func(fd int) (err error) {
		if seq, err = queueSeq(fd, tcpSendQueue); err != nil {
			return err
		}
		ack, err = queueSeq(fd, tcpRecvQueue)
		return err
	})
	return seq, ack
}

// holdSend writes req on c through its verdict, but in repair mode: TCP
// queues it as sent without sending it, and sends it again once the mode
// is left (after its retransmission timeout).
func holdSend(t *testing.T, c net.Conn, req string) {
	t.Helper()
	inRepair(t, c, func(fd int) error {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, tcpSendQueue); err != nil {
			return err
		}
		_, err := unix.Write(fd, []byte(req))
		return err
	})
}

// sendRawTCP sends one TCP segment (PSH, ACK) from a raw socket, the
// kernel adding the IPv4 header.
func sendRawTCP(src, dst netip.AddrPort, seq, ack uint32, payload []byte) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return fmt.Errorf("raw socket: %w", err)
	}
	defer unix.Close(fd)
	seg := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(seg[0:], src.Port())
	binary.BigEndian.PutUint16(seg[2:], dst.Port())
	binary.BigEndian.PutUint32(seg[4:], seq)
	binary.BigEndian.PutUint32(seg[8:], ack)
	seg[12] = 5 << 4
	seg[13] = 0x18 // PSH, ACK
	binary.BigEndian.PutUint16(seg[14:], 65535)
	seg = append(seg, payload...)
	binary.BigEndian.PutUint16(seg[16:], tcpChecksum(src.Addr(), dst.Addr(), seg))
	return unix.Sendto(fd, seg, 0, &unix.SockaddrInet4{Addr: dst.Addr().As4()})
}

// tcpChecksum is the checksum of a TCP segment whose checksum field is 0:
// the Internet checksum over the IPv4 pseudo-header and the segment.
func tcpChecksum(src, dst netip.Addr, seg []byte) uint16 {
	s, d := src.As4(), dst.As4()
	pseudo := append(append(append([]byte{}, s[:]...), d[:]...), 0, syscall.IPPROTO_TCP, byte(len(seg)>>8), byte(len(seg)))
	return testutil.Checksum(append(pseudo, seg...))
}

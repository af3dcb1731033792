package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/weirnet/weir/internal/lab"
)

// previousRelease is the release an upgrade starts from: the commit that
// landed before the pinned maps' migration (internal/datapath/migrate.go),
// whose agents never recorded their maps' layouts.
const previousRelease = "43e364f"

// upgradeManifest: a server on n2; clients the policy admits on both
// nodes (far, near); one it denies (denied).
var upgradeManifest = "apiVersion: v1\nkind: Namespace\nmetadata: {name: upgrade}\n" +
	upgradePod("server", "n2", "{app: server}") + upgradePod("far", "n1", `{access: "yes"}`) +
	upgradePod("near", "n2", `{access: "yes"}`) + upgradePod("denied", "n1", "{}") + `---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server, namespace: upgrade}
spec:
  podSelector: {matchLabels: {app: server}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {access: "yes"}}}]
    ports: [{protocol: TCP, port: 9000}, {protocol: UDP, port: 9001}]
`

// upgradePod is a pod of the upgrade namespace that only sleeps: the
// test opens its sockets in the pod's network namespace.
func upgradePod(name, node, labels string) string {
	return fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: upgrade, labels: %s}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 0
  containers: [{name: c, image: %s, imagePullPolicy: Never, args: [pause]}]
`, name, labels, node, lab.AgnhostImage)
}

// TestUpgradeFromPreviousRelease installs the previous release with its
// chart and image, then helm-upgrades it to this tree's while pods on two
// nodes talk over TCP and UDP under a NetworkPolicy: no established
// connection may break, no packet of the denied pod may get through, and
// new connections may not be refused for longer than one node's rollout.
// The figures are logged for the README.
func TestUpgradeFromPreviousRelease(t *testing.T) {
	st := newKubeLabConfig(t, lab.Config{Release: previousRelease})
	ctx := context.Background()
	c, err := st.Client()
	if err != nil {
		t.Fatal(err)
	}
	agentsRun(t, st, previousReleaseCommit(t))

	if out, err := st.Kubectl(ctx, strings.NewReader(upgradeManifest), "apply", "-f", "-"); err != nil {
		t.Fatalf("apply: %v %s", err, out)
	}
	if out, err := st.Kubectl(ctx, nil, "-n", "upgrade", "wait", "--for=condition=Ready", "pod/server", "pod/far", "pod/near", "pod/denied", "--timeout=120s"); err != nil {
		t.Fatalf("pods: %v %s", err, out)
	}
	pods := map[string]corev1.Pod{}
	list, err := c.CoreV1().Pods("upgrade").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		pods[p.Name] = p
	}
	server := pods["server"]
	serverNS := podNS(t, st, server)
	tcpAddr := net.JoinHostPort(server.Status.PodIP, "9000")
	udpAddr := net.JoinHostPort(server.Status.PodIP, "9001")
	// The server counts what reaches it from the denied pod: a packet let
	// through counts even if its answer is lost on the way back.
	deniedIP := net.ParseIP(pods["denied"].Status.PodIP)
	var reached sync.Map // "tcp" / "udp" → *atomic.Int64
	fromDenied := func(kind string) func(net.Addr) {
		n, _ := reached.LoadOrStore(kind, new(atomic.Int64))
		return func(a net.Addr) {
			if ip := addrIP(a); ip != nil && ip.Equal(deniedIP) {
				n.(*atomic.Int64).Add(1)
			}
		}
	}
	ln := listenIn(t, serverNS, ":9000")
	defer ln.Close()
	go serveEchoEach(ln, fromDenied("tcp"))
	pc := listenUDPIn(t, serverNS, ":9001")
	defer pc.Close()
	go serveUDPEcho(pc, fromDenied("udp"))

	// The policy is in force before the upgrade starts: the denied pod
	// gets nothing through, the others get through.
	waitFor(t, 30*time.Second, func() error {
		if err := dialOnce(podNS(t, st, pods["denied"]), tcpAddr, 300*time.Millisecond); err == nil {
			return errors.New("the denied pod still connects")
		}
		return dialOnce(podNS(t, st, pods["far"]), tcpAddr, time.Second)
	})

	before := endpointsByNode(t, st)
	ifindexes := hostIfindexes(t, st)
	far := keepTalking(dialIn(t, podNS(t, st, pods["far"]), tcpAddr))
	near := keepTalking(dialIn(t, podNS(t, st, pods["near"]), tcpAddr))
	udp := startUDPStream(t, podNS(t, st, pods["far"]), udpAddr, 10*time.Millisecond)
	fresh := startDialing(podNS(t, st, pods["far"]), tcpAddr, 20*time.Millisecond)
	intruder := startIntruder(podNS(t, st, pods["denied"]), tcpAddr, udpAddr)
	watch := watchRollout(ctx, t, c)
	time.Sleep(2 * time.Second)

	// An upgrade the pinned maps cannot take: the chart's check refuses it
	// before any agent is replaced, saying why.
	refuseUpgrade(t, st)

	start := time.Now()
	if err := st.UpgradeWeir(ctx); err != nil {
		t.Fatalf("helm upgrade: %v", err)
	}
	if out, err := st.Kubectl(ctx, nil, "-n", "kube-system", "rollout", "status", "daemonset/weir-agent", "--timeout=5m"); err != nil {
		dumpAgentPods(t, st)
		t.Fatalf("rollout: %v %s", err, out)
	}
	rollout := time.Since(start)
	time.Sleep(3 * time.Second) // and traffic still flows after it

	nodes := watch.stop()
	farSent, farErr := far.stop()
	nearSent, nearErr := near.stop()
	u := udp.stop()
	f := fresh.stop()
	in := intruder.stop()

	var longestNode time.Duration
	var perNode []string
	for _, n := range slices.Sorted(maps.Keys(nodes)) {
		r := nodes[n]
		if r.up.IsZero() || r.down.IsZero() {
			t.Errorf("node %s: the rollout was not seen (agent stopped %v, new agent ready %v)", n, r.down, r.up)
			continue
		}
		d := r.up.Sub(r.down)
		longestNode = max(longestNode, d)
		perNode = append(perNode, fmt.Sprintf("%s %.1f s", n, d.Seconds()))
	}
	t.Logf("UPGRADE %s -> HEAD: rollout %.1f s (%s); TCP: %d+%d echoes, errors %v / %v; new connections: %d made, %d failed, longest gap %v; UDP: %d sent, %d lost, longest gap %v; denied pod: %d TCP and %d UDP attempts, %d got through",
		previousRelease, rollout.Seconds(), strings.Join(perNode, ", "), farSent, nearSent, farErr, nearErr,
		f.made, f.failed, f.longestGap.Round(time.Millisecond), u.sent, u.lost, u.longestGap.Round(time.Millisecond),
		in.tcpTries, in.udpTries, in.through)

	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	agentsRun(t, st, strings.TrimSpace(string(head)))
	if farErr != nil || nearErr != nil {
		t.Errorf("an established connection broke: across nodes %v, on one node %v", farErr, nearErr)
	}
	for _, kind := range []string{"tcp", "udp"} {
		if n, _ := reached.Load(kind); n.(*atomic.Int64).Load() > 0 {
			t.Errorf("the server received %d %s connections or datagrams from the denied pod", n.(*atomic.Int64).Load(), kind)
		}
	}
	if in.through > 0 {
		t.Errorf("the denied pod got %d answers through during the upgrade", in.through)
	}
	if in.tcpTries == 0 || in.udpTries == 0 {
		t.Errorf("the denied pod never tried (%d TCP, %d UDP)", in.tcpTries, in.udpTries)
	}
	if f.made == 0 || f.longestGap > longestNode {
		t.Errorf("new connections: longest gap %v, longer than one node's rollout (%v), %d made", f.longestGap, longestNode, f.made)
	}
	if u.lost > 0 {
		t.Errorf("%d of %d UDP datagrams lost during the upgrade (longest gap %v)", u.lost, u.sent, u.longestGap)
	}
	if after := endpointsByNode(t, st); fmt.Sprint(before) != fmt.Sprint(after) {
		t.Errorf("endpoints changed:\n%v\n%v", before, after)
	}
	if got := hostIfindexes(t, st); fmt.Sprint(got) != fmt.Sprint(ifindexes) {
		t.Errorf("pods were re-plumbed: host veths %v -> %v", ifindexes, got)
	}
}

// refuseUpgrade records, on every node, the conntrack map's layout as one
// this version does not lay out alike (as a version that changed it would
// have), and checks that helm upgrade fails in the chart's upgrade check,
// whose log names the map and what to do, with the agents and their
// DaemonSet left as they were. Then it removes the record again.
func refuseUpgrade(t *testing.T, st *lab.State) {
	t.Helper()
	ctx := context.Background()
	ds := func() string {
		out, err := st.Kubectl(ctx, nil, "-n", "kube-system", "get", "daemonset/weir-agent", "-o", "jsonpath={.metadata.generation} {.spec.template.spec.containers[0].image}")
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	before := ds()
	var records []string
	for _, n := range st.Nodes {
		spec := &ebpf.MapSpec{Name: "weir_map_layouts", Type: ebpf.Hash, KeySize: 64, ValueSize: 8, MaxEntries: 256, Pinning: ebpf.PinByName}
		m, err := ebpf.NewMapWithOptions(spec, ebpf.MapOptions{PinPath: st.NodePinDir(n.Name)})
		if err != nil {
			t.Fatal(err)
		}
		var key [64]byte
		copy(key[:], "weir_ct")
		err = m.Put(key, uint64(1))
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		records = append(records, filepath.Join(st.NodePinDir(n.Name), "weir_map_layouts"))
	}
	defer func() {
		for _, r := range records {
			if err := os.Remove(r); err != nil {
				t.Error(err)
			}
		}
	}()
	err := st.UpgradeWeir(ctx)
	if err == nil || !strings.Contains(err.Error(), "pre-upgrade hooks failed") {
		t.Fatalf("helm upgrade over maps laid out otherwise: %v, want the upgrade check to fail it", err)
	}
	logs, _ := st.Kubectl(ctx, nil, "-n", "kube-system", "logs", "job/weir-upgrade-check")
	for _, want := range []string{"weir_ct (its key or value is laid out differently", "weir-agent uninstall"} {
		if !strings.Contains(string(logs), want) {
			t.Errorf("the upgrade check's log does not say %q:\n%s", want, logs)
		}
	}
	if after := ds(); after != before {
		t.Errorf("a refused upgrade changed the DaemonSet: %s -> %s", before, after)
	}
	agentsRun(t, st, previousReleaseCommit(t))
	t.Logf("refused upgrade: %s", strings.TrimSpace(string(logs)))
}

// previousReleaseCommit names previousRelease in full.
func previousReleaseCommit(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", previousRelease+"^{commit}").Output()
	if err != nil {
		t.Fatalf("git rev-parse %s: %v", previousRelease, err)
	}
	return strings.TrimSpace(string(out))
}

// agentsRun waits until every node's agent reports commit.
func agentsRun(t *testing.T, st *lab.State, commit string) {
	t.Helper()
	for _, n := range st.Nodes {
		waitFor(t, 2*time.Minute, func() error {
			v, err := n.Client().Version(context.Background())
			if err != nil {
				return err
			}
			if v.Commit != commit {
				return fmt.Errorf("node %s runs %s, want %s", n.Name, v.Commit, commit)
			}
			if v.Modified && commit == previousReleaseCommit(t) {
				return fmt.Errorf("node %s runs %s with changes: the tree's build, not the release's", n.Name, commit)
			}
			return nil
		})
	}
}

func dumpAgentPods(t *testing.T, st *lab.State) {
	out, _ := st.Kubectl(context.Background(), nil, "-n", "kube-system", "get", "pods", "-o", "wide")
	t.Logf("pods:\n%s", out)
	out, _ = st.Kubectl(context.Background(), nil, "-n", "kube-system", "describe", "pods", "-l", "app.kubernetes.io/name=weir-agent")
	t.Logf("agent pods:\n%s", out)
}

// serveEchoEach echoes every connection ln accepts, line by line, telling
// seen each client's address.
func serveEchoEach(ln net.Listener, seen func(net.Addr)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		seen(c.RemoteAddr())
		go echoLines(c)
	}
}

func listenUDPIn(t *testing.T, nsPath, addr string) net.PacketConn {
	t.Helper()
	return openIn(t, nsPath, func() (net.PacketConn, error) { return net.ListenPacket("udp4", addr) })
}

// serveUDPEcho sends every datagram back to its sender, telling seen its
// address.
func serveUDPEcho(pc net.PacketConn, seen func(net.Addr)) {
	buf := make([]byte, 2048)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		seen(from)
		pc.WriteTo(buf[:n], from)
	}
}

func addrIP(a net.Addr) net.IP {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.IP
	case *net.UDPAddr:
		return a.IP
	}
	return nil
}

// dialOnce opens and closes one TCP connection from nsPath, with an echo
// through it.
func dialOnce(nsPath, addr string, timeout time.Duration) error {
	var c net.Conn
	err := lab.InNS(nsPath, func() (err error) {
		c, err = net.DialTimeout("tcp4", addr, timeout)
		return err
	})
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("hello\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "hello\n" {
		return fmt.Errorf("echo %q: %v", line, err)
	}
	return nil
}

// gapTracker records the longest time between successive events.
type gapTracker struct {
	last, started time.Time
	longest       time.Duration
}

func (g *gapTracker) event(at time.Time) {
	prev := g.last
	if prev.IsZero() {
		prev = g.started
	}
	g.longest = max(g.longest, at.Sub(prev))
	g.last = at
}

// udpStream sends numbered datagrams at an interval and counts those
// echoed back.
type udpStream struct {
	conn     net.Conn
	done     chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	sent     int
	received map[int]bool
	gaps     gapTracker
}

type udpResult struct {
	sent, lost int
	longestGap time.Duration
}

func startUDPStream(t *testing.T, nsPath, addr string, every time.Duration) *udpStream {
	t.Helper()
	var conn net.Conn
	if err := lab.InNS(nsPath, func() (err error) {
		conn, err = net.Dial("udp4", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	s := &udpStream{conn: conn, done: make(chan struct{}), received: map[int]bool{}, gaps: gapTracker{started: time.Now()}}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		buf := make([]byte, 64)
		for {
			n, err := conn.Read(buf)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil {
				continue // an ICMP error the datagram met: keep listening
			}
			var seq int
			if _, err := fmt.Sscanf(string(buf[:n]), "seq %d", &seq); err == nil {
				s.mu.Lock()
				s.received[seq] = true
				s.gaps.event(time.Now())
				s.mu.Unlock()
			}
		}
	}()
	go func() {
		defer s.wg.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for seq := 0; ; seq++ {
			select {
			case <-s.done:
				return
			case <-tick.C:
			}
			conn.Write([]byte(fmt.Sprintf("seq %d", seq)))
			s.mu.Lock()
			s.sent = seq + 1
			s.mu.Unlock()
		}
	}()
	return s
}

// stop stops sending, waits for the last echoes and counts the lost.
func (s *udpStream) stop() udpResult {
	close(s.done)
	time.Sleep(500 * time.Millisecond)
	s.conn.Close()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return udpResult{sent: s.sent, lost: s.sent - len(s.received), longestGap: s.gaps.longest}
}

// dialer opens a new connection at an interval, each with one echo.
type dialer struct {
	done chan struct{}
	res  chan dialResult
}

type dialResult struct {
	made, failed int
	longestGap   time.Duration
}

func startDialing(nsPath, addr string, every time.Duration) *dialer {
	d := &dialer{done: make(chan struct{}), res: make(chan dialResult, 1)}
	go func() {
		var r dialResult
		gaps := gapTracker{started: time.Now()}
		for {
			select {
			case <-d.done:
				gaps.event(time.Now()) // a gap still open at the end counts
				r.longestGap = gaps.longest
				d.res <- r
				return
			case <-time.After(every):
			}
			if err := dialOnce(nsPath, addr, time.Second); err != nil {
				r.failed++
				continue
			}
			r.made++
			gaps.event(time.Now())
		}
	}()
	return d
}

func (d *dialer) stop() dialResult {
	close(d.done)
	return <-d.res
}

// intruder keeps trying, from a pod the policy denies, to reach the
// server over TCP and UDP, and counts what gets through.
type intruder struct {
	done chan struct{}
	res  chan intruderResult
}

type intruderResult struct {
	tcpTries, udpTries, through int
}

func startIntruder(nsPath, tcpAddr, udpAddr string) *intruder {
	in := &intruder{done: make(chan struct{}), res: make(chan intruderResult, 1)}
	go func() {
		var r intruderResult
		for {
			select {
			case <-in.done:
				in.res <- r
				return
			case <-time.After(50 * time.Millisecond):
			}
			r.tcpTries++
			if err := dialOnce(nsPath, tcpAddr, 200*time.Millisecond); err == nil {
				r.through++
			}
			r.udpTries++
			if udpAnswered(nsPath, udpAddr, 100*time.Millisecond) {
				r.through++
			}
		}
	}()
	return in
}

func (in *intruder) stop() intruderResult {
	close(in.done)
	return <-in.res
}

// udpAnswered sends one datagram from nsPath and says whether an answer
// came back in time.
func udpAnswered(nsPath, addr string, timeout time.Duration) bool {
	var conn net.Conn
	if err := lab.InNS(nsPath, func() (err error) {
		conn, err = net.Dial("udp4", addr)
		return err
	}); err != nil {
		return false
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write([]byte("intruder")); err != nil {
		return false
	}
	buf := make([]byte, 64)
	_, err := conn.Read(buf)
	return err == nil
}

// nodeRollout is when a node's agent pod of before the upgrade stopped
// serving (deleted or terminating) and when its successor became Ready.
type nodeRollout struct {
	down, up time.Time
}

type rolloutWatch struct {
	done chan struct{}
	res  chan map[string]*nodeRollout
}

// watchRollout polls the agent pods every 100 ms and times each node's
// turn in the rollout.
func watchRollout(ctx context.Context, t *testing.T, c kubernetes.Interface) *rolloutWatch {
	t.Helper()
	sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=weir-agent"}
	list, err := c.CoreV1().Pods("kube-system").List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	old := map[string]string{} // node → pod UID before the upgrade
	for _, p := range list.Items {
		old[p.Spec.NodeName] = string(p.UID)
	}
	w := &rolloutWatch{done: make(chan struct{}), res: make(chan map[string]*nodeRollout, 1)}
	go func() {
		nodes := map[string]*nodeRollout{}
		for n := range old {
			nodes[n] = &nodeRollout{}
		}
		for {
			select {
			case <-w.done:
				w.res <- nodes
				return
			case <-time.After(100 * time.Millisecond):
			}
			list, err := c.CoreV1().Pods("kube-system").List(ctx, sel)
			if err != nil {
				continue
			}
			now := time.Now()
			seenOld := map[string]bool{}
			for _, p := range list.Items {
				r := nodes[p.Spec.NodeName]
				if r == nil {
					continue
				}
				if string(p.UID) == old[p.Spec.NodeName] {
					seenOld[p.Spec.NodeName] = true
					if p.DeletionTimestamp != nil && r.down.IsZero() {
						r.down = now
					}
					continue
				}
				if r.up.IsZero() && podReady(p) {
					r.up = now
				}
			}
			for n, r := range nodes {
				if !seenOld[n] && r.down.IsZero() {
					r.down = now
				}
			}
		}
	}()
	return w
}

func (w *rolloutWatch) stop() map[string]*nodeRollout {
	close(w.done)
	return <-w.res
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

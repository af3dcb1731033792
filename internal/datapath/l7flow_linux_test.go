package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/policy"
	"github.com/weirnet/weir/internal/testutil"
)

// restrictIngress sets the HTTP set of every allowing ingress entry of
// ifindex to set (0 lifts the restriction), as the agent writes an
// allow that HTTP rules restrict, and makes every flow be judged again.
func restrictIngress(t *testing.T, n *Node, ifindex uint32, set uint32) {
	t.Helper()
	restrictDir(t, n, ifindex, 0, set)
}

// restrictDir is restrictIngress for entries of direction dir (0
// ingress, 1 egress).
func restrictDir(t *testing.T, n *Node, ifindex uint32, dir uint8, set uint32) {
	t.Helper()
	var (
		k       lxcPolicyKey
		e       lxcPolicyEntry
		keys    []lxcPolicyKey
		entries []lxcPolicyEntry
	)
	it := n.progs.Policy.Iterate()
	for it.Next(&k, &e) {
		if k.Ifindex == ifindex && k.Dir == dir && e.Allow != 0 {
			e.Http = set
			keys, entries = append(keys, k), append(entries, e)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if len(keys) == 0 {
		t.Fatalf("no allowing entry of direction %d of ifindex %d", dir, ifindex)
	}
	for i := range keys {
		if err := n.progs.Policy.Put(keys[i], entries[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.bumpPolicyRevision(); err != nil {
		t.Fatal(err)
	}
}

// l7FlowOf reads the weir_l7_flows entry of a connection as its server
// names it; ok is false when there is none.
func l7FlowOf(t *testing.T, p *Programs, client netip.AddrPort, server netip.AddrPort) (lxcL7Flow, bool) {
	t.Helper()
	var f lxcL7Flow
	err := p.L7Flows.Lookup(l7FlowKey(client, server), &f)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return f, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return f, true
}

// l7OutOf reads the weir_l7_out entry of a connection as its client
// names it; ok is false when there is none.
func l7OutOf(t *testing.T, p *Programs, client netip.AddrPort, server netip.AddrPort) (lxcL7OutFlow, bool) {
	t.Helper()
	var f lxcL7OutFlow
	err := p.L7Out.Lookup(l7OutKey(client, server), &f)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return f, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return f, true
}

// l7OutKey is a connection as its client's socket names it.
func l7OutKey(client, server netip.AddrPort) lxcL7SockKey {
	return l7FlowKey(server, client)
}

func l7FlowKey(client, server netip.AddrPort) lxcL7SockKey {
	c, s := client.Addr().As4(), server.Addr().As4()
	return lxcL7SockKey{Remote: nativeUint32(c), Local: nativeUint32(s), RemotePort: client.Port(), LocalPort: server.Port()}
}

// nativeUint32 is an address's bytes read as the kernel stores a __be32.
func nativeUint32(a [4]byte) uint32 {
	return uint32(a[0]) | uint32(a[1])<<8 | uint32(a[2])<<16 | uint32(a[3])<<24
}

// TestL7FlowGate: a connection NetworkPolicy allows only through HTTP
// rules is recorded in weir_l7_flows on its SYN with the policy's set,
// and no byte toward the server passes until the server's socket joined
// the reader (sock_ops sets joined): the handshake, pure ACKs and the
// server's own bytes do. A policy change reaches the recorded flow (a
// lifted restriction passes it whole; one that comes back, or a lost
// entry, holds its bytes again), and a SYN carrying data waits too.
func TestL7FlowGate(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	n := &Node{progs: p}
	c := policy.NewCompiler()
	loadPolicy(t, n, c, nil, policyFixture(ingressFromApp("a", "TCP", 80)))
	restrictIngress(t, n, ifB, 7)

	client, server := netip.AddrPortFrom(podA, 40500), netip.AddrPortFrom(podB, 80)
	send := func(what string, src, dst netip.AddrPort, flags uint8, payload string, want uint32) {
		t.Helper()
		from := uint32(ifA)
		if src.Addr() == podB {
			from = ifB
		}
		f := tcpFrame(hostMAC, podMAC, src.Addr(), dst.Addr(), src.Port(), dst.Port(), 1, flags, []byte(payload))
		if ret, _ := run(t, p.FromContainer, f, from); ret != want {
			t.Fatalf("%s: verdict %d, want %d", what, ret, want)
		}
	}
	unjoined := metric(t, p, "drop_l7_unjoined")
	send("SYN", client, server, tcpSYN, "", tcActRedirect)
	f, ok := l7FlowOf(t, p, client, server)
	if !ok || f.Sets != [3]uint32{7, 0, 0} || f.Joined != 0 {
		t.Fatalf("flow entry after the SYN: %+v (found %v), want set 7, not joined", f, ok)
	}
	send("SYN-ACK", server, client, tcpSYN|tcpACK, "", tcActRedirect)
	send("ACK", client, server, tcpACK, "", tcActRedirect)
	// A frame padded to Ethernet's minimum (a NIC's) carries no payload.
	padded := append(tcpFrame(hostMAC, podMAC, client.Addr(), server.Addr(), client.Port(), server.Port(), 1, tcpACK, nil), 0, 0, 0, 0, 0, 0)
	if ret, _ := run(t, p.FromContainer, padded, ifA); ret != tcActRedirect {
		t.Fatalf("ACK padded to 60 bytes: verdict %d, want redirect", ret)
	}
	send("request before the join", client, server, tcpACK, "GET / HTTP/1.1\r\n", tcActShot)
	if got := metric(t, p, "drop_l7_unjoined") - unjoined; got != 1 {
		t.Fatalf("drop_l7_unjoined rose by %d, want 1", got)
	}
	send("the server's bytes", server, client, tcpACK, "hello", tcActRedirect)
	send("FIN", client, server, tcpFIN|tcpACK, "", tcActRedirect)

	// Joined: the reader sees what follows.
	f.Joined = 1
	if err := p.L7Flows.Put(l7FlowKey(client, server), f); err != nil {
		t.Fatal(err)
	}
	send("request once joined", client, server, tcpACK, "GET / HTTP/1.1\r\n", tcActRedirect)

	// A policy that no longer restricts: the flow passes whole, its
	// entry says unrestricted for the reader.
	restrictIngress(t, n, ifB, 0)
	send("request, restriction lifted", client, server, tcpACK, "GET / HTTP/1.1\r\n", tcActRedirect)
	if f, ok = l7FlowOf(t, p, client, server); !ok || f.Sets != [3]uint32{} || f.Joined != 1 {
		t.Fatalf("flow entry after the restriction was lifted: %+v (found %v), want sets 0, joined", f, ok)
	}
	// Restricted again: the sets come back, the socket is still joined.
	restrictIngress(t, n, ifB, 9)
	send("request, restricted again", client, server, tcpACK, "GET / HTTP/1.1\r\n", tcActRedirect)
	if f, _ = l7FlowOf(t, p, client, server); f.Sets != [3]uint32{9, 0, 0} {
		t.Fatalf("flow entry after a new restriction: %+v, want set 9", f)
	}
	// An entry lost from under the connection (LRU eviction): closed.
	if err := p.L7Flows.Delete(l7FlowKey(client, server)); err != nil {
		t.Fatal(err)
	}
	send("request, entry lost", client, server, tcpACK, "GET / HTTP/1.1\r\n", tcActShot)

	// A connection opened unrestricted and restricted while open never
	// joined: it carries no more bytes.
	open := netip.AddrPortFrom(podA, 40501)
	restrictIngress(t, n, ifB, 0)
	send("SYN, unrestricted", open, server, tcpSYN, "", tcActRedirect)
	if _, ok := l7FlowOf(t, p, open, server); ok {
		t.Fatal("an unrestricted connection was recorded in weir_l7_flows")
	}
	send("request, unrestricted", open, server, tcpACK, "GET / HTTP/1.1\r\n", tcActRedirect)
	restrictIngress(t, n, ifB, 7)
	send("request, restricted once open", open, server, tcpACK, "GET / HTTP/1.1\r\n", tcActShot)
	if f, ok := l7FlowOf(t, p, open, server); !ok || f.Joined != 0 || f.Sets[0] != 7 {
		t.Fatalf("flow restricted once open: %+v (found %v), want set 7, not joined", f, ok)
	}

	// TCP Fast Open: data on the SYN waits for the join like any other.
	send("SYN with data", netip.AddrPortFrom(podA, 40502), server, tcpSYN, "GET / HTTP/1.1\r\n", tcActShot)
}

// egressToAll is a policy letting pods app=app send TCP to port on any
// address, and nothing else.
func egressToAll(app string, port int32) *networkingv1.NetworkPolicy {
	np := ingressFromApp(app, "TCP", port)
	np.Name = "egress-" + app
	np.Spec.PodSelector.MatchLabels["app"] = app
	np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{Ports: np.Spec.Ingress[0].Ports}}
	np.Spec.Ingress = nil
	np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	return np
}

// TestL7EgressGate: a connection a client's egress policy allows only
// through HTTP rules is recorded in weir_l7_out on its SYN, as the
// client's socket names it, and no byte of it leaves the client's veth
// until that socket joined the egress reader. Then a byte passes only
// from that socket (the cookie the skb's socket has) and below the mark
// its message verdict judged to: a segment forged by any other socket of
// the pod (a raw or packet socket: here, a packet with no socket) is
// dropped. Packets without payload pass; a fragment never does.
func TestL7EgressGate(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	n := &Node{progs: p}
	c := policy.NewCompiler()
	loadPolicy(t, n, c, nil, policyFixture(egressToAll("a", 80)))
	restrictDir(t, n, ifA, 1, 7)

	client, server := netip.AddrPortFrom(podA, 40700), netip.AddrPortFrom(podB, 80)
	send := func(what string, src, dst netip.AddrPort, seq uint32, flags uint8, payload string, want uint32) {
		t.Helper()
		from := uint32(ifA)
		if src.Addr() == podB {
			from = ifB
		}
		f := tcpFrame(hostMAC, podMAC, src.Addr(), dst.Addr(), src.Port(), dst.Port(), seq, flags, []byte(payload))
		if ret, _ := run(t, p.FromContainer, f, from); ret != want {
			t.Fatalf("%s: verdict %d, want %d", what, ret, want)
		}
	}
	const req = "GET / HTTP/1.1\r\n\r\n"
	unjoined, unjudged := metric(t, p, "drop_l7_unjoined"), metric(t, p, "drop_l7_unjudged")
	send("SYN", client, server, 1000, tcpSYN, "", tcActRedirect)
	f, ok := l7OutOf(t, p, client, server)
	if !ok || f.Sets != [3]uint32{0, 0, 7} || f.Joined != 0 {
		t.Fatalf("egress flow after the SYN: %+v (found %v), want set 7 (from the lookup of any peer), not joined", f, ok)
	}
	if _, ok := l7FlowOf(t, p, client, server); ok {
		t.Fatal("an egress restriction was recorded as the server's (weir_l7_flows)")
	}
	send("SYN-ACK", server, client, 5000, tcpSYN|tcpACK, "", tcActRedirect)
	send("ACK", client, server, 1001, tcpACK, "", tcActRedirect)
	send("request before the join", client, server, 1001, tcpACK, req, tcActShot)
	if got := metric(t, p, "drop_l7_unjoined") - unjoined; got != 1 {
		t.Fatalf("drop_l7_unjoined rose by %d, want 1", got)
	}
	send("the server's bytes", server, client, 5001, tcpACK, "hello", tcActRedirect)

	// Joined by a socket with another cookie than the packet's: a
	// segment the pod forged on the connection's tuple.
	f.Joined, f.Cookie, f.Judged = 1, 0x5eed, 1001+uint32(len(req))
	if err := p.L7Out.Put(l7OutKey(client, server), f); err != nil {
		t.Fatal(err)
	}
	send("a forged segment", client, server, 1001, tcpACK, req, tcActShot)
	send("an ACK from anywhere", client, server, 1001, tcpACK, "", tcActRedirect)
	if got := metric(t, p, "drop_l7_unjudged") - unjudged; got != 1 {
		t.Fatalf("drop_l7_unjudged rose by %d, want 1", got)
	}

	// A fragment never passes, whatever it carries.
	f.Cookie = 0
	if err := p.L7Out.Put(l7OutKey(client, server), f); err != nil {
		t.Fatal(err)
	}
	frag := asFragment(tcpFrame(hostMAC, podMAC, podA, podB, client.Port(), server.Port(), 1001, tcpACK, []byte(req)), 7, 0, true)
	if ret, _ := run(t, p.FromContainer, frag, ifA); ret != tcActShot {
		t.Fatalf("a fragment: verdict %d, want drop", ret)
	}
	// (A packet of BPF_PROG_RUN names a socket of its own, made for
	// the run, so the joined socket's bytes and the judged mark are held
	// to with real sockets: TestEgressHTTPOnTheClientsSocket.)

	// Restriction lifted: the flow passes whole.
	restrictDir(t, n, ifA, 1, 0)
	send("past the mark, restriction lifted", client, server, 9000, tcpACK, req, tcActRedirect)

	// TCP Fast Open: data on the SYN waits for a join that cannot come.
	restrictDir(t, n, ifA, 1, 7)
	send("SYN with data", netip.AddrPortFrom(podA, 40701), server, 1, tcpSYN, req, tcActShot)
}

// TestL7JoinsRecordedFlows: with real sockets, a connection recorded in
// weir_l7_flows (as tc records one policy restricts) joins the reader
// when its handshake completes, whatever its port, is marked joined, and
// is judged against the union of its entry's sets as they are on each
// skb: sets rewritten while it is open (a policy change) apply to its
// next request, sets all 0 pass every request, a lost entry closes it.
// A connection not recorded, on a port not enforced, is not read. The
// entry goes when the socket closes.
func TestL7JoinsRecordedFlows(t *testing.T) {
	testutil.RequireRoot(t)
	spec, err := loadL7()
	if err != nil {
		t.Fatal(err)
	}
	ms := spec.Maps["weir_l7_flows"].Copy()
	ms.Pinning = ebpf.PinNone
	flows, err := ebpf.NewMap(ms)
	if err != nil {
		t.Fatal(err)
	}
	defer flows.Close()
	cg := l7TestCgroup(t)
	s, err := AttachL7Sockets(cg, L7FlowMaps{In: flows})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	for id, rules := range map[uint32][]l7.Rule{
		1: {{Method: "POST", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/v1/request-landing"}}},
		2: {{Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/public"}}},
	} {
		k, err := l7.CompileKernel(rules, s.HashKey())
		if err != nil {
			t.Fatal(err)
		}
		if err := s.WriteHTTPSet(id, k); err != nil {
			t.Fatal(err)
		}
	}
	const port = 18620
	server := netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", port))
	startHTTPHelper(t, cg, server.String())

	// dial connects from a port the kernel picks, recorded with sets
	// before the SYN leaves unless sets is nil; it waits for the server's
	// side to be marked joined.
	// dialBound connects from a port the kernel picks, calling before
	// the SYN leaves with the connection's key, unless before is nil.
	dialBound := func(before func(lxcL7SockKey) error) (net.Conn, netip.AddrPort) {
		t.Helper()
		var client netip.AddrPort
		d := net.Dialer{Control: testutil.LoopbackBound(func(c netip.AddrPort) error {
			client = c
			if before != nil {
				return before(l7FlowKey(client, server))
			}
			return nil
		})}
		c, err := d.Dial("tcp4", server.String())
		if err != nil {
			t.Fatal(err)
		}
		return c, client
	}
	dial := func(sets *[3]uint32) (net.Conn, netip.AddrPort) {
		t.Helper()
		var record func(lxcL7SockKey) error
		if sets != nil {
			record = func(k lxcL7SockKey) error { return flows.Put(k, lxcL7Flow{Sets: *sets}) }
		}
		c, client := dialBound(record)
		if sets == nil {
			return c, client
		}
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			var f lxcL7Flow
			if err := flows.Lookup(l7FlowKey(client, server), &f); err == nil && f.Joined == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("connection from %v never marked joined", client)
			}
		}
		return c, client
	}
	setFlow := func(client netip.AddrPort, sets [3]uint32) {
		t.Helper()
		if err := flows.Put(l7FlowKey(client, server), lxcL7Flow{Sets: sets, Joined: 1}); err != nil {
			t.Fatal(err)
		}
	}
	const (
		landing = "POST /v1/request-landing HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 4\r\n\r\nland"
		exhaust = "PUT /v1/exhaust-port HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 4\r\n\r\nboom"
		public  = "GET /public/x HTTP/1.1\r\nHost: deathstar\r\nX-Padding: 0123456789012345678901234567890123456789\r\n\r\n"
	)

	// Set 1: the landing is served, the exhaust port answered 403.
	c, client := dial(&[3]uint32{1, 0, 0})
	got := exchangeOn(c, landing, exhaust)
	if !strings.Contains(got, "POST /v1/request-landing") || !strings.Contains(got, "HTTP/1.1 403 ") || strings.Contains(got, "PUT /v1") {
		t.Fatalf("set 1: %q, want the landing served and a 403", got)
	}
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var f lxcL7Flow
		if errors.Is(flows.Lookup(l7FlowKey(client, server), &f), ebpf.ErrKeyNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the flow entry outlived its socket")
		}
	}

	// The union of two sets.
	c, _ = dial(&[3]uint32{2, 1, 0})
	got = exchangeOn(c, landing, public, exhaust)
	if !strings.Contains(got, "POST /v1/request-landing") || !strings.Contains(got, "GET /public/x") || !strings.Contains(got, "HTTP/1.1 403 ") {
		t.Fatalf("sets 2 and 1: %q, want the landing and /public served, then a 403", got)
	}

	// Sets rewritten while the connection is open apply to its next
	// request: lifted, then narrowed to set 2.
	c, client = dial(&[3]uint32{1, 0, 0})
	setFlow(client, [3]uint32{})
	c.Write([]byte(exhaust))
	buf := make([]byte, 4096)
	c.SetReadDeadline(time.Now().Add(time.Second))
	nr, _ := c.Read(buf)
	if !strings.Contains(string(buf[:nr]), "PUT /v1/exhaust-port") {
		t.Fatalf("restriction lifted: %q, want the PUT served", buf[:nr])
	}
	setFlow(client, [3]uint32{2, 0, 0})
	got = exchangeOn(c, landing)
	if !strings.HasPrefix(got, "HTTP/1.1 403 ") {
		t.Fatalf("narrowed to set 2: %q, want the landing denied", got)
	}

	// An entry lost from under a joined connection closes it.
	c, client = dial(&[3]uint32{1, 0, 0})
	if err := flows.Delete(l7FlowKey(client, server)); err != nil {
		t.Fatal(err)
	}
	if got = exchangeOn(c, landing); got != "" {
		t.Fatalf("entry lost: %q, want nothing", got)
	}

	// Not recorded, port not enforced: the server reads it unjudged.
	c, _ = dial(nil)
	if got = exchangeOn(c, exhaust); !strings.Contains(got, "PUT /v1/exhaust-port") {
		t.Fatalf("unrecorded connection: %q, want it served", got)
	}

	// A recorded connection that cannot join its reader (its key taken
	// in the socket hash, refused as a full hash refuses) is reset by
	// the sweep: on a node tc holds its bytes back for good, and its
	// client would otherwise wait for its own timeout.
	taken, _ := dial(nil)
	defer taken.Close()
	raw, err := taken.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var takenFD uintptr
	raw.Control(func(fd uintptr) { takenFD = fd })
	refused, _ := dialBound(func(k lxcL7SockKey) error {
		return errors.Join(flows.Put(k, lxcL7Flow{Sets: [3]uint32{1}}), s.objs.WeirL7Http.Put(k, uint64(takenFD)))
	})
	defer refused.Close()
	outcome := readUntilError(refused)
	for deadline := time.Now().Add(time.Second); !l7ResetPending(s.objs.WeirL7Closing); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a connection that could not join is not listed for reset")
		}
	}
	sweepUntilDone(t, s)
	if o := <-outcome; !errors.Is(o.err, syscall.ECONNRESET) {
		t.Fatalf("a connection that could not join: read %q, then %v; want a reset", o.got, o.err)
	}

	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.JoinFail != 1 || st.Sockets != 4 || st.Reset != 1 {
		t.Errorf("counters %+v: want 4 sockets joined, one refused and reset", st)
	}
}

// TestL7SetsFollowPolicy: on a node that reads requests (EnableL7), an
// ingress or egress allow restricted to HTTP rules is written as an
// allow with its set, the set written first; the SYN of such a
// connection records the set, as the server's socket names the flow for
// ingress and as the client's does for egress; a changed rule is a new
// set, the flow takes it on its next packet and the old set goes. On a
// node that does not read requests every such allow stays closed.
func TestL7SetsFollowPolicy(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	cg := l7TestCgroup(t)
	s, err := AttachL7Sockets(cg, L7FlowMaps{In: p.L7Flows, Out: p.L7Out})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	landing := l7.Rule{Method: "POST", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/v1/request-landing"}}
	health := l7.Rule{Method: "GET", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/healthz"}}
	snapshot := func(rule l7.Rule) *policy.Snapshot {
		in := ingressFromApp("a", "TCP", 80)
		out := ingressFromApp("a", "TCP", 8080, 80) // HTTP rules on 8080 only
		out.Name, out.Spec.PodSelector.MatchLabels["app"] = "egress", "a"
		out.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{Ports: out.Spec.Ingress[0].Ports}}
		out.Spec.Ingress = nil
		out.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		snap := policyFixture(in, out)
		snap.HTTP = map[*networkingv1.NetworkPolicy]*policy.PolicyHTTP{
			in:  {Ingress: [][][]l7.Rule{{{rule}}}},
			out: {Egress: [][][]l7.Rule{{{rule}, nil}}},
		}
		return snap
	}
	// A node that does not read requests: closed.
	plain := &Node{progs: p}
	c := policy.NewCompiler()
	res := loadPolicy(t, plain, c, nil, snapshot(landing))
	restricted := 0
	for k, e := range res.Endpoints["x/b"].Entries {
		if e.HTTP == 0 {
			continue
		}
		var v lxcPolicyEntry
		if err := p.Policy.Lookup(policyKey(ifB, k), &v); err != nil || v.Allow != 0 || v.Http != 0 {
			t.Fatalf("entry %v on a node that does not read requests written as %+v (%v), want closed", k, v, err)
		}
		restricted++
	}
	if restricted == 0 {
		t.Fatal("no entry of x/b restricted to HTTP rules")
	}
	loadPolicy(t, plain, c, res, &policy.Snapshot{})

	n := &Node{progs: p}
	if err := n.EnableL7(s); err != nil {
		t.Fatal(err)
	}
	c = policy.NewCompiler()
	ingressSet := func(res *policy.Result) policy.HTTPSetID {
		t.Helper()
		for k, e := range res.Endpoints["x/b"].Entries {
			if k.Direction == policy.Ingress && e.HTTP != 0 {
				return e.HTTP
			}
		}
		t.Fatal("no ingress entry of x/b restricted to HTTP rules")
		return 0
	}
	first := loadPolicy(t, n, c, nil, snapshot(landing))
	set := ingressSet(first)
	for k, e := range first.Endpoints["x/b"].Entries {
		var v lxcPolicyEntry
		if err := p.Policy.Lookup(policyKey(ifB, k), &v); err != nil {
			t.Fatal(err)
		}
		if e.HTTP != 0 && (v.Allow == 0 || v.Http != uint32(set)) {
			t.Fatalf("entry %v written as %+v, want an allow restricted to set %d", k, v, set)
		}
	}
	var row l7L7Set
	if err := s.objs.WeirL7Sets.Lookup(uint32(set), &row); err != nil {
		t.Fatalf("set %d not written: %v", set, err)
	}
	// The egress allow on 8080 is restricted to its own set, read by
	// the client's message verdict; a SYN to 8080 records the flow as
	// the client names it.
	var egressSet policy.HTTPSetID
	for k, e := range first.Endpoints["x/a"].Entries {
		if k.Direction != policy.Egress || e.HTTP == 0 {
			continue
		}
		var v lxcPolicyEntry
		if err := p.Policy.Lookup(policyKey(ifA, k), &v); err != nil || v.Allow == 0 || v.Http != uint32(e.HTTP) {
			t.Fatalf("egress entry %v restricted to HTTP rules written as %+v (%v), want an allow restricted to set %d", k, v, err, e.HTTP)
		}
		egressSet = e.HTTP
	}
	if egressSet == 0 {
		t.Fatal("no egress entry restricted to HTTP rules")
	}
	out := netip.AddrPortFrom(podA, 40601)
	toRemote := netip.AddrPortFrom(remote, 8080)
	osyn := tcpFrame(hostMAC, podMAC, podA, remote, out.Port(), toRemote.Port(), 1, tcpSYN, nil)
	if ret, _ := run(t, p.FromContainer, osyn, ifA); ret != tcActRedirect {
		t.Fatalf("SYN to 8080: verdict %d, want redirect", ret)
	}
	if f, ok := l7OutOf(t, p, out, toRemote); !ok || f.Sets != [3]uint32{0, 0, uint32(egressSet)} || f.Joined != 0 {
		t.Fatalf("egress flow after the SYN: %+v (found %v), want set %d, not joined", f, ok, egressSet)
	}

	client, server := netip.AddrPortFrom(podA, 40600), netip.AddrPortFrom(podB, 80)
	syn := tcpFrame(hostMAC, podMAC, podA, podB, client.Port(), server.Port(), 1, tcpSYN, nil)
	if ret, _ := run(t, p.FromContainer, syn, ifA); ret != tcActRedirect {
		t.Fatalf("SYN: verdict %d, want redirect", ret)
	}
	if f, ok := l7FlowOf(t, p, client, server); !ok || f.Sets[0] != uint32(set) {
		t.Fatalf("flow after the SYN: %+v (found %v), want set %d", f, ok, set)
	}

	// The rule changes: a new set; the flow takes it on its next packet.
	second := loadPolicy(t, n, c, first, snapshot(health))
	next := ingressSet(second)
	if next == set {
		t.Fatalf("a changed rule kept set %d", set)
	}
	if err := s.objs.WeirL7Sets.Lookup(uint32(set), &row); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("the old set %d is still written: %v", set, err)
	}
	ack := tcpFrame(hostMAC, podMAC, podA, podB, client.Port(), server.Port(), 2, tcpACK, nil)
	if ret, _ := run(t, p.FromContainer, ack, ifA); ret != tcActRedirect {
		t.Fatalf("ACK: verdict %d, want redirect", ret)
	}
	if f, _ := l7FlowOf(t, p, client, server); f.Sets[0] != uint32(next) {
		t.Fatalf("flow after the change: %+v, want set %d", f, next)
	}
	// Policy gone: every set goes.
	loadPolicy(t, n, c, second, &policy.Snapshot{})
	var id uint32
	if err := s.objs.WeirL7Sets.NextKey(nil, &id); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("set %d left after every policy went: %v", id, err)
	}
}

// TestL7SurvivesRestart: the node's L7 path (SetupL7) keeps judging an
// open keep-alive connection while no agent runs and after another
// takes over: its socket, reader state and set are pinned. The new
// agent numbers its sets above the earlier one's, and the first full
// load removes the earlier sets.
func TestL7SurvivesRestart(t *testing.T) {
	dir, cfg := migrationPinDir(t)
	if err := os.MkdirAll(filepath.Join(dir, "cgroup"), 0o700); err != nil {
		t.Fatal(err)
	}
	cg := l7TestCgroup(t)
	start := func() *Node {
		t.Helper()
		p, err := LoadPrograms(cfg)
		if err != nil {
			t.Fatal(err)
		}
		n := &Node{cfg: NodeConfig{PinDir: dir}, progs: p}
		if err := n.setupL7(cg); err != nil {
			n.Close()
			t.Fatal(err)
		}
		return n
	}
	n := start()
	k, err := l7.CompileKernel([]l7.Rule{{Method: "POST", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/v1/request-landing"}}}, n.l7.key)
	if err != nil {
		t.Fatal(err)
	}
	// The set as an apply writes it, the port given it directly (no tc
	// on loopback to record the connection).
	n.l7.written[1] = k
	set := n.l7.base + 1
	if err := n.l7.tables.writeSet(set, k); err != nil {
		t.Fatal(err)
	}
	const port = 18630
	if err := n.l7objs.WeirL7Ports.Put(uint16(port), l7L7Port{Mode: uint8(L7HTTP), Set: set}); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	startHTTPHelper(t, cg, addr)
	const (
		landing = "POST /v1/request-landing HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 4\r\n\r\nland"
		exhaust = "PUT /v1/exhaust-port HTTP/1.1\r\nHost: deathstar\r\nContent-Length: 4\r\n\r\nboom"
	)
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ask := func(req, want string) {
		t.Helper()
		if _, err := c.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		nr, err := c.Read(buf)
		if err != nil || !strings.Contains(string(buf[:nr]), want) {
			t.Fatalf("%q: got %q (%v), want %q", req[:20], buf[:nr], err, want)
		}
	}
	ask(landing, "POST /v1/request-landing")

	// The agent goes: every handle closes, the pins stay.
	firstKey := n.l7.key
	n.Close()
	ask(landing, "POST /v1/request-landing")

	n = start()
	defer n.Close()
	if n.l7.base < set || !n.l7.stale {
		t.Fatalf("the new agent numbers sets from %d (stale %v), want above %d", n.l7.base, n.l7.stale, set)
	}
	ask(landing, "POST /v1/request-landing")
	// The new agent hashes under the key the kept socket's programs were
	// loaded with: a set it writes, given to the open connection as tc
	// gives a policy change, still allows the landing there.
	if n.l7.key != firstKey {
		t.Fatal("the new agent's hash key is not the pinned one")
	}
	k2, err := l7.CompileKernel([]l7.Rule{{Method: "POST", Path: &l7.PathMatch{Type: l7.PathExact, Value: "/v1/request-landing"}}}, n.l7.key)
	if err != nil {
		t.Fatal(err)
	}
	set2 := n.l7.base + 1
	if err := n.l7.tables.writeSet(set2, k2); err != nil {
		t.Fatal(err)
	}
	var fk l7L7SockKey
	var fv l7L7Flow
	var keys []l7L7SockKey
	for it := n.l7objs.WeirL7Flows.Iterate(); it.Next(&fk, &fv); {
		if fv.Sets[0] == set {
			keys = append(keys, fk)
		}
	}
	for _, fk := range keys {
		if err := n.l7objs.WeirL7Flows.Update(fk, l7L7Flow{Sets: [3]uint32{set2}, Joined: 1}, ebpf.UpdateExist); err != nil {
			t.Fatal(err)
		}
	}
	if len(keys) == 0 {
		t.Fatal("no flow of the kept connection")
	}
	ask(landing, "POST /v1/request-landing")
	// weir_l7_ports is no node state (tests and benches give a port its
	// set): given again, as the new agent's load would record flows.
	if err := n.l7objs.WeirL7Ports.Put(uint16(port), l7L7Port{Mode: uint8(L7HTTP), Set: set}); err != nil {
		t.Fatal(err)
	}
	if got := rawExchange(t, addr, exhaust); !strings.HasPrefix(got, "HTTP/1.1 403 ") {
		t.Fatalf("a new connection's denied request after the restart: %q, want 403", got)
	}
	// Last on the old connection: the denial, which closes it. The
	// first agent's verdict lists it in the pinned reset list, and the
	// new agent's sweep resets it after the 403.
	outcome := readUntilError(c)
	if _, err := c.Write([]byte(exhaust)); err != nil {
		t.Fatal(err)
	}
	loopback := func(a netip.Addr) (string, bool) { return "/proc/self/ns/net", a == netip.MustParseAddr("127.0.0.1") }
	for deadline := time.Now().Add(time.Second); !n.L7ResetPending(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the denial that closes the old connection did not list it for reset")
		}
	}
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		left, err := n.ResetClosedL7(loopback)
		if err != nil {
			t.Fatal(err)
		}
		if left == 0 && !n.L7ResetPending() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the old connection is not reset after 3 s")
		}
	}
	if o := <-outcome; !strings.HasPrefix(o.got, "HTTP/1.1 403 ") || !errors.Is(o.err, syscall.ECONNRESET) {
		t.Fatalf("the old connection's denied request after the restart: %q, then %v; want 403, then a reset", o.got, o.err)
	}
	// The first full load removes what the earlier agent wrote.
	if err := n.pruneHTTPSets(&policy.Result{}); err != nil {
		t.Fatal(err)
	}
	var row l7L7Set
	if err := n.l7objs.WeirL7Sets.Lookup(set, &row); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("the earlier agent's set %d is still there after the first full load: %v", set, err)
	}
	st, err := n.L7Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.JoinFail != 0 || st.Denied < 2 {
		t.Errorf("counters %+v: want no join refused, 2 denials", st)
	}
}

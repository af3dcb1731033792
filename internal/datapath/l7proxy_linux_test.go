package datapath

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/weirnet/weir/internal/l7"
)

// TestProxySlotPairs: slots opened at once each get the two ends of one
// connection (what Q writes is steered by its peer's port: a crossed
// pair would answer one client on another's connection), a stranger
// reaching the pairs' listener first is turned away, and each slot is
// offered to the kernel once.
func TestProxySlotPairs(t *testing.T) {
	s, _ := attachL7ForTest(t)
	p := s.Proxy()
	defer p.Close()
	first, err := p.OpenSlot(0)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	stranger, err := net.Dial("tcp4", p.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()

	const n = 64
	slots := make([]*ProxySlot, n)
	var wg sync.WaitGroup
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sl, err := p.OpenSlot(uint32(i))
			if err != nil {
				t.Error(err)
				return
			}
			slots[i] = sl
		}()
	}
	wg.Wait()
	slots[0] = first
	offered := map[uint32]int{}
	var slot uint32
	for s.objs.WeirL7Free.LookupAndDelete(nil, &slot) == nil {
		offered[slot]++
	}
	for i, sl := range slots {
		if sl == nil {
			continue
		}
		defer sl.Close()
		if sl.In.LocalAddr().String() != sl.Answer.RemoteAddr().String() {
			t.Errorf("slot %d: P %v, but Q's peer is %v", i, sl.In.LocalAddr(), sl.Answer.RemoteAddr())
		}
		if offered[uint32(i)] != 1 {
			t.Errorf("slot %d offered %d times", i, offered[uint32(i)])
		}
		var got uint32
		if err := s.objs.WeirL7ProxyPorts.Lookup(uint32(sl.In.LocalAddr().(*net.TCPAddr).Port), &got); err != nil || got != uint32(i) {
			t.Errorf("slot %d: its port names slot %d (%v)", i, got, err)
		}
	}
}

// TestProxyBacklogBound: a handed connection whose proxy does not read
// is closed once its stream runs 4 MiB ahead: the server socket's window
// no longer holds the client back, so this bound does.
func TestProxyBacklogBound(t *testing.T) {
	s, addr, slot := oneSlotServer(t, 18670, "POST") // slot never read: a proxy that cannot keep up
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const body = 6 << 20
	if _, err := c.Write([]byte("POST /pub")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)
	if _, err := fmt.Fprintf(c, "lic/up HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n", body); err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	for sent := 0; sent < body; sent += len(chunk) {
		if _, err := c.Write(chunk); err != nil {
			break // the connection stalls once closed: its bytes are dropped
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		st, err := s.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st.Handed == 1 && st.ProxyBehind == 1 && st.Closed == 1 {
			h, err := slot.Handoff()
			if err != nil {
				t.Fatal(err)
			}
			if h.Redirected > 4<<20 {
				t.Fatalf("%d bytes redirected to a proxy that read none, want at most 4 MiB", h.Redirected)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("counters %+v: want the handed connection closed once 4 MiB ahead of its proxy", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestProxySlotOfferedTwice: a slot in the free queue twice (its pair
// replaced while it was queued) serves one connection only: the second
// connection to pop it is closed, never given a stream another
// connection is using.
func TestProxySlotOfferedTwice(t *testing.T) {
	s, addr, slot := oneSlotServer(t, 18671, "GET")
	if err := s.objs.WeirL7Free.Update(nil, uint32(0), ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	for i := range 2 {
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
		c.Write([]byte("GET /pub"))
		time.Sleep(30 * time.Millisecond)
		c.Write([]byte(fmt.Sprintf("lic/%d HTTP/1.1\r\nHost: h\r\n\r\n", i)))
		time.Sleep(30 * time.Millisecond)
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	h, err := slot.Handoff()
	if err != nil {
		t.Fatal(err)
	}
	if st.Handed != 1 || st.Closed != 1 || !h.Active {
		t.Fatalf("counters %+v, slot %+v: want the first connection handed and the second closed", st, h)
	}
	buf := make([]byte, 256)
	slot.In.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	n, _ := slot.In.Read(buf)
	if got := string(buf[:n]); got != "GET /public/0 HTTP/1.1\r\nHost: h\r\n\r\n" {
		t.Fatalf("the slot's stream: %q, want the first connection's alone", got)
	}
}

// oneSlotServer serves HTTP on port, allowing method on /public, with
// one hand-off slot offered and no proxy reading it.
func oneSlotServer(t *testing.T, port uint16, method string) (*L7Sockets, string, *ProxySlot) {
	t.Helper()
	s, cg := attachL7ForTest(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	serveHTTPRules(t, s, cg, addr, port, 1, []l7.Rule{{Method: method, Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/public"}}})
	p := s.Proxy()
	t.Cleanup(func() { p.Close() })
	slot, err := p.OpenSlot(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slot.Close() })
	return s, addr, slot
}

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/lab"
)

// TestAgentRestartKeepsTraffic keeps a TCP connection between pods on two
// nodes busy while both agents are stopped and started again: the pinned
// datapath must carry every message, and the new agents must adopt the
// pods without re-plumbing them (same veths, same addresses).
func TestAgentRestartKeepsTraffic(t *testing.T) {
	st := newLab(t, 2, 1, datapath.ModeVXLAN)
	client, _ := st.PodByName("n1-p1")
	server, _ := st.PodByName("n2-p1")

	ln := listenIn(t, lab.PodNSPath(*server), ":9000")
	defer ln.Close()
	go serveEcho(ln)
	conn := dialIn(t, lab.PodNSPath(*client), net.JoinHostPort(server.IP.String(), "9000"))
	defer conn.Close()

	before := endpointsByNode(t, st)
	stop := make(chan struct{})
	errs := make(chan error, 1)
	sent := 0
	go func() {
		r := bufio.NewReader(conn)
		for i := 0; ; i++ {
			select {
			case <-stop:
				errs <- nil
				return
			default:
			}
			conn.SetDeadline(time.Now().Add(2 * time.Second))
			msg := fmt.Sprintf("msg %d\n", i)
			if _, err := conn.Write([]byte(msg)); err != nil {
				errs <- fmt.Errorf("write %d: %w", i, err)
				return
			}
			got, err := r.ReadString('\n')
			if err != nil || got != msg {
				errs <- fmt.Errorf("echo %d: %q, %v", i, got, err)
				return
			}
			sent = i + 1
			time.Sleep(5 * time.Millisecond)
		}
	}()
	for _, n := range []string{"n1", "n2"} {
		if err := st.StopAgent(n); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond) // traffic flows with no agent at all
		if err := st.StartAgent(context.Background(), n); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	if err := <-errs; err != nil {
		t.Fatalf("connection broke across agent restarts: %v", err)
	}
	if sent < 50 {
		t.Fatalf("only %d echoes went through", sent)
	}
	after := endpointsByNode(t, st)
	for node, eps := range before {
		if fmt.Sprint(eps) != fmt.Sprint(after[node]) {
			t.Fatalf("node %s endpoints changed across restart: %v -> %v", node, eps, after[node])
		}
	}
	t.Logf("%d echoes across two agent restarts", sent)
}

func endpointsByNode(t *testing.T, st *lab.State) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, n := range st.Nodes {
		s, err := n.Client().Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range s.Endpoints {
			out[n.Name] = append(out[n.Name], e.Address.String()+"@"+e.HostIfName)
		}
		out[n.Name] = append(out[n.Name], fmt.Sprintf("map=%d", s.MapEntries))
	}
	return out
}

// serveEcho answers the first connection ln accepts line by line.
func serveEcho(ln net.Listener) {
	c, err := ln.Accept()
	if err != nil {
		return
	}
	echoLines(c)
}

// echoLines sends every line c reads back, until either end closes it.
func echoLines(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if _, err := c.Write([]byte(line)); err != nil {
			return
		}
	}
}

func listenIn(t *testing.T, nsPath, addr string) net.Listener {
	t.Helper()
	return openIn(t, nsPath, func() (net.Listener, error) { return net.Listen("tcp4", addr) })
}

func dialIn(t *testing.T, nsPath, addr string) net.Conn {
	t.Helper()
	return openIn(t, nsPath, func() (net.Conn, error) { return net.DialTimeout("tcp4", addr, 3*time.Second) })
}

// openIn opens a socket in the network namespace at nsPath, failing the
// test if it cannot.
func openIn[T any](t *testing.T, nsPath string, open func() (T, error)) T {
	t.Helper()
	var out T
	err := lab.InNS(nsPath, func() (err error) {
		out, err = open()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

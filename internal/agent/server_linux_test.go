package agent

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/weirnet/weir/internal/api"
)

// freeLoopbackAddr returns a 127.0.0.1 port nothing listens on.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// awaitAccepting waits until addr accepts TCP connections: ServeOn opens
// its health and metrics listeners after the test has started it, so a
// request sent at once can find the port still closed.
func awaitAccepting(t *testing.T, addr string) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return
		}
	}
	t.Fatalf("%s never accepted a connection: %v", addr, err)
}

// The kubelet probes the agent over TCP; that port answers the health
// check and nothing else of the local API, which stays root's socket.
func TestHealthAddrServesHealthOnly(t *testing.T) {
	n := newTestNode(t, "10.244.7.0/24")
	n.agent.cfg.HealthAddr = freeLoopbackAddr(t)
	ln, err := n.agent.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- n.agent.ServeOn(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
		if c, err := net.DialTimeout("tcp", n.agent.cfg.HealthAddr, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after the agent stopped", n.agent.cfg.HealthAddr)
		}
	}()
	get := func(path string) int {
		t.Helper()
		var resp *http.Response
		var err error
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if resp, err = http.Get("http://" + n.agent.cfg.HealthAddr + path); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(api.PathHealth); code != http.StatusOK {
		t.Errorf("GET %s: status %d, want 200", api.PathHealth, code)
	}
	for _, path := range []string{api.PathStatus, api.PathFlows, "/debug/pprof/"} {
		if code := get(path); code != http.StatusNotFound {
			t.Errorf("GET %s over TCP: status %d, want 404 (the local API is the socket's alone)", path, code)
		}
	}
	if err := api.NewClient(n.agent.cfg.Socket).Health(context.Background()); err != nil {
		t.Errorf("health over the socket: %v", err)
	}
}

// A taken health port is a start-up error naming the flag, and the
// socket listener handed in is closed, not leaked.
func TestHealthAddrInUse(t *testing.T) {
	n := newTestNode(t, "10.244.8.0/24")
	serveOnTakenPort(t, n, &n.agent.cfg.HealthAddr, "--health-addr")
}

// serveOnTakenPort points *addr at a port already in use and requires
// ServeOn to fail naming flag, with the socket listener closed.
func serveOnTakenPort(t *testing.T, n *testNode, addr *string, flag string) {
	t.Helper()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	*addr = taken.Addr().String()
	ln, err := n.agent.Listen()
	if err != nil {
		t.Fatal(err)
	}
	err = n.agent.ServeOn(context.Background(), ln)
	if err == nil || !strings.Contains(err.Error(), flag) {
		t.Fatalf("serve with a taken port: %v, want an error naming %s", err, flag)
	}
	if c, err := ln.Accept(); err == nil {
		c.Close()
		t.Fatal("the socket listener still accepts after a failed start")
	}
}

package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
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

// The local API adds and removes pods' networking: its socket is root's
// alone from the moment it exists (mode 0600, owner root, no temporary
// name left behind), another user is refused, and a restarted agent
// replaces it.
func TestSocketIsRootsAlone(t *testing.T) {
	n := newTestNode(t, "10.244.9.0/24")
	// A directory every user may enter, so that a refusal comes from the
	// socket's mode; a socket open to all there is the control.
	dir, err := os.MkdirTemp("", "weir-sock-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	n.agent.cfg.Socket = filepath.Join(dir, "agent.sock")
	open, err := net.Listen("unix", filepath.Join(dir, "open.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if err := os.Chmod(filepath.Join(dir, "open.sock"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := dialAsNobody(filepath.Join(dir, "open.sock")); err != nil {
		t.Fatalf("control: another user cannot reach a socket open to all: %v", err)
	}
	for round := range 2 { // the second: an agent restarted over the first's socket
		ln, err := n.agent.Listen()
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(n.agent.cfg.Socket)
		if err != nil {
			ln.Close()
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 || st.Uid != 0 {
			t.Errorf("round %d: socket mode %v owner %d, want a socket 0600 owned by root", round, fi.Mode(), st.Uid)
		}
		entries, _ := os.ReadDir(filepath.Dir(n.agent.cfg.Socket))
		for _, e := range entries {
			if e.Name() != "agent.sock" && e.Name() != "open.sock" {
				t.Errorf("round %d: %s left beside the socket", round, e.Name())
			}
		}
		if err := dialAsNobody(n.agent.cfg.Socket); !errors.Is(err, syscall.EACCES) {
			t.Errorf("round %d: another user connecting: %v, want EACCES", round, err)
		}
		ln.Close()
	}
}

// dialAsNobody connects to a unix socket as uid and gid 65534, on a
// thread of its own whose credentials alone change (the raw syscalls,
// not Go's, which change every thread); the thread is never returned to
// the runtime, so it ends with the goroutine.
func dialAsNobody(path string) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESGID, 65534, 65534, 65534); e != 0 {
			done <- fmt.Errorf("setresgid: %w", e)
			return
		}
		if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, 65534, 65534, 65534); e != 0 {
			done <- fmt.Errorf("setresuid: %w", e)
			return
		}
		fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			done <- err
			return
		}
		defer syscall.Close(fd)
		done <- syscall.Connect(fd, &syscall.SockaddrUnix{Name: path})
	}()
	return <-done
}

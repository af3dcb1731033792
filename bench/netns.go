package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// A socket belongs to the network namespace its thread was in when it was
// created, so the benchmark can listen and dial "inside" pods without a
// helper process: ns.WithNetNSPath pins the goroutine's thread, switches,
// runs the function and switches back. Everything after creation (accept,
// read, write) works from any thread.

// echoServer accepts on ports inside one namespace and echoes every byte
// back: the far end of reachability probes and of live connections whose
// revocation is timed.
type echoServer struct {
	nsPath string
	mu     sync.Mutex
	lns    map[int]net.Listener
	wg     sync.WaitGroup
}

func newEchoServer(nsPath string) *echoServer {
	return &echoServer{nsPath: nsPath, lns: map[int]net.Listener{}}
}

// listen starts accepting on port (all addresses) unless it already does.
func (e *echoServer) listen(port int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.lns[port]; ok {
		return nil
	}
	var ln net.Listener
	err := ns.WithNetNSPath(e.nsPath, func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", port))
		return err
	})
	if err != nil {
		return fmt.Errorf("listen on %d in %s: %w", port, e.nsPath, err)
	}
	e.lns[port] = ln
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return nil
}

func (e *echoServer) close() {
	e.mu.Lock()
	for _, ln := range e.lns {
		ln.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
}

// dialIn opens a TCP connection from inside the namespace at nsPath.
func dialIn(ctx context.Context, nsPath, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		d := net.Dialer{Timeout: timeout}
		var err error
		c, err = d.DialContext(ctx, "tcp4", addr)
		return err
	})
	return c, err
}

// reachable reports whether one connection attempt succeeds within
// timeout. A policy drop is silent, so "no" is a timeout.
func reachable(ctx context.Context, nsPath, addr string, timeout time.Duration) bool {
	c, err := dialIn(ctx, nsPath, addr, timeout)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// errNeverReachable is returned when a wait for a grant runs out.
var errNeverReachable = errors.New("never reachable")

// firstReachable starts a connection attempt every interval, each given
// up to 50 ms, and returns when the first one connects: the moment a
// grant is enforced, to within interval, however long a dropped attempt
// takes to give up. The connection is the caller's.
//
// One thread does it all, entering the namespace once: the attempts are
// non-blocking sockets polled together. (A thread per attempt, each
// switching namespaces, cost the machine under test a CPU's share of
// setns calls and thread switches while it was being timed.)
func firstReachable(ctx context.Context, nsPath, addr string, interval, limit time.Duration) (net.Conn, time.Time, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		return nil, time.Time{}, fmt.Errorf("probe address %q: want IPv4 address:port", addr)
	}
	sa := &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}
	var conn net.Conn
	var at time.Time
	err = ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		p := &connectPoller{}
		defer p.closeAll()
		deadline := time.Now().Add(limit)
		next := time.Now()
		for time.Now().Before(deadline) {
			if err := ctx.Err(); err != nil {
				return err
			}
			if now := time.Now(); !now.Before(next) {
				if err := p.start(sa, now); err != nil {
					return err
				}
				next = now.Add(interval)
			}
			fd, when, err := p.wait(time.Until(next), 50*time.Millisecond)
			if err != nil {
				return err
			}
			if fd >= 0 {
				f := os.NewFile(uintptr(fd), "probe")
				conn, err = net.FileConn(f) // dups fd onto Go's poller
				f.Close()
				at = when
				return err
			}
		}
		return fmt.Errorf("%s from %s within %v: %w", addr, nsPath, limit, errNeverReachable)
	})
	return conn, at, err
}

// connectPoller holds non-blocking TCP connection attempts in flight.
type connectPoller struct {
	fds     []int
	started []time.Time
}

// start sends one SYN: a non-blocking connect on a new socket (in the
// namespace of the calling thread).
func (p *connectPoller) start(sa unix.Sockaddr, now time.Time) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("probe socket: %w", err)
	}
	if err := unix.Connect(fd, sa); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		unix.Close(fd) // refused at once, or no route yet: the next one tries again
		return nil
	}
	p.fds = append(p.fds, fd)
	p.started = append(p.started, now)
	return nil
}

// wait polls the attempts for up to timeout and returns the descriptor of
// one that connected (removed from the poller) and when it was seen, or
// -1. Failed attempts and those older than maxAge are closed.
func (p *connectPoller) wait(timeout, maxAge time.Duration) (int, time.Time, error) {
	if len(p.fds) == 0 {
		time.Sleep(max(0, timeout))
		return -1, time.Time{}, nil
	}
	pfds := make([]unix.PollFd, len(p.fds))
	for i, fd := range p.fds {
		pfds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLOUT}
	}
	ts := unix.NsecToTimespec(max(0, timeout.Nanoseconds()))
	if _, err := unix.Ppoll(pfds, &ts, nil); err != nil && !errors.Is(err, unix.EINTR) {
		return -1, time.Time{}, fmt.Errorf("poll probes: %w", err)
	}
	now := time.Now()
	won := -1
	keep := 0
	for i, pfd := range pfds {
		fd := p.fds[i]
		if pfd.Revents != 0 && won < 0 {
			if soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err == nil && soErr == 0 {
				won = fd
				continue
			}
		}
		if pfd.Revents != 0 || now.Sub(p.started[i]) > maxAge {
			unix.Close(fd)
			continue
		}
		p.fds[keep], p.started[keep] = fd, p.started[i]
		keep++
	}
	p.fds, p.started = p.fds[:keep], p.started[:keep]
	return won, now, nil
}

func (p *connectPoller) closeAll() {
	for _, fd := range p.fds {
		unix.Close(fd)
	}
	p.fds, p.started = nil, nil
}

// lastEcho pings over c every interval (one byte out, the echo back within
// wait) until an echo does not come, and returns when the first unanswered
// ping was sent: the moment a revocation took hold of a live connection.
// An echo later than wait but within 300 ms counts as an answer.
func lastEcho(c net.Conn, interval, wait, limit time.Duration) (time.Time, error) {
	deadline := time.Now().Add(limit)
	buf := []byte{0}
	for time.Now().Before(deadline) {
		sent := time.Now()
		c.SetDeadline(sent.Add(wait))
		if _, err := c.Write(buf); err != nil {
			return sent, nil
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			// A late echo (a busy machine) is not a revocation: give
			// it a while longer before calling the connection dead.
			c.SetDeadline(time.Now().Add(300 * time.Millisecond))
			if _, err := io.ReadFull(c, buf); err != nil {
				return sent, nil
			}
		}
		time.Sleep(interval)
	}
	return time.Time{}, fmt.Errorf("connection to %s still answered after %v", c.RemoteAddr(), limit)
}

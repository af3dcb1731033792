package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
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
func firstReachable(ctx context.Context, nsPath, addr string, interval, limit time.Duration) (net.Conn, time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	type win struct {
		c  net.Conn
		at time.Time
	}
	won := make(chan win, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := dialIn(ctx, nsPath, addr, 50*time.Millisecond)
			if err != nil {
				return
			}
			select {
			case won <- win{c, time.Now()}:
			default:
				c.Close() // another attempt won
			}
		}()
		select {
		case w := <-won:
			cancel()
			return w.c, w.at, nil
		case <-ctx.Done():
			select {
			case w := <-won:
				return w.c, w.at, nil
			default:
			}
			return nil, time.Time{}, fmt.Errorf("%s from %s within %v: %w", addr, nsPath, limit, errNeverReachable)
		case <-tick.C:
		}
	}
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

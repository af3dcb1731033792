package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/weirnet/weir/internal/lab"
)

// serviceLoad keeps Service traffic going from one pod's network namespace
// to an agnhost netexec Service: one HTTP keep-alive connection asking
// /hostname over and over (an established Service flow), and a new
// connection every few tens of milliseconds (new flows, each balanced
// afresh). It records what answered, so a test can say what a disruption
// cost: nothing, if every request of both kinds was answered.
type serviceLoad struct {
	nsPath, addr string
	done         chan struct{}
	stopOnce     sync.Once
	wg           sync.WaitGroup

	mu sync.Mutex
	// kept counts the answers on the established connection and
	// keptFrom names the backends that gave them (one, unless the
	// connection moved, which it must not).
	kept     int
	keptFrom map[string]bool
	keptErr  error
	// fresh counts the new connections answered, by backend;
	// freshFailed those that were not, freshErr the first failure.
	fresh       map[string]int
	freshFailed int
	freshErr    error
}

// serviceLoadResult is what a serviceLoad saw.
type serviceLoadResult struct {
	Kept        int
	KeptFrom    []string
	KeptErr     error
	Fresh       int
	FreshFrom   map[string]int
	FreshFailed int
	FreshErr    error
}

// startServiceLoad opens the established connection (failing if it
// cannot) and starts both loops.
func startServiceLoad(nsPath, addr string) (*serviceLoad, error) {
	l := &serviceLoad{nsPath: nsPath, addr: addr, done: make(chan struct{}), keptFrom: map[string]bool{}, fresh: map[string]int{}}
	conn, err := l.dial()
	if err != nil {
		return nil, fmt.Errorf("open the established connection to %s: %w", addr, err)
	}
	l.wg.Add(2)
	go l.keepAsking(conn)
	go l.openFresh()
	return l, nil
}

func (l *serviceLoad) dial() (net.Conn, error) {
	var c net.Conn
	err := lab.InNS(l.nsPath, func() (err error) {
		c, err = net.DialTimeout("tcp4", l.addr, 2*time.Second)
		return err
	})
	return c, err
}

// keepAsking asks /hostname on conn until stopped or until an answer
// fails to come.
func (l *serviceLoad) keepAsking(conn net.Conn) {
	defer l.wg.Done()
	defer conn.Close()
	r := bufio.NewReader(conn)
	for {
		select {
		case <-l.done:
			return
		default:
		}
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		name, err := askHostname(conn, r, true)
		l.mu.Lock()
		if err != nil {
			l.keptErr = fmt.Errorf("request %d on the established connection: %w", l.kept+1, err)
			l.mu.Unlock()
			return
		}
		l.kept++
		l.keptFrom[name] = true
		l.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
}

// openFresh opens a new connection every 50 ms until stopped, one
// request each.
func (l *serviceLoad) openFresh() {
	defer l.wg.Done()
	every50ms(l.done, func() {
		name, err := l.askOnce()
		l.mu.Lock()
		if err != nil {
			l.freshFailed++
			if l.freshErr == nil {
				l.freshErr = err
			}
		} else {
			l.fresh[name]++
		}
		l.mu.Unlock()
	})
}

// every50ms calls fn every 50 ms until done is closed.
func every50ms(done <-chan struct{}, fn func()) {
	for {
		select {
		case <-done:
			return
		case <-time.After(50 * time.Millisecond):
		}
		fn()
	}
}

func (l *serviceLoad) askOnce() (string, error) {
	c, err := l.dial()
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	return askHostname(c, bufio.NewReader(c), false)
}

// askHostname sends GET /hostname and returns the answer, netexec's pod
// name.
func askHostname(c net.Conn, r *bufio.Reader, keepAlive bool) (string, error) {
	conn := "close"
	if keepAlive {
		conn = "keep-alive"
	}
	if _, err := fmt.Fprintf(c, "GET /hostname HTTP/1.1\r\nHost: web\r\nConnection: %s\r\n\r\n", conn); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %s", resp.Status)
	}
	name := strings.TrimSpace(string(b))
	if name == "" {
		return "", errors.New("empty hostname")
	}
	return name, nil
}

// stop ends both loops and returns what they saw; it may be called again.
func (l *serviceLoad) stop() serviceLoadResult {
	l.stopOnce.Do(func() { close(l.done) })
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	res := serviceLoadResult{Kept: l.kept, KeptErr: l.keptErr, FreshFrom: l.fresh, FreshFailed: l.freshFailed, FreshErr: l.freshErr}
	for name := range l.keptFrom {
		res.KeptFrom = append(res.KeptFrom, name)
	}
	for _, n := range l.fresh {
		res.Fresh += n
	}
	return res
}

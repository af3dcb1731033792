package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
)

// ProbePort is where the lab's echo servers listen (TCP and UDP).
const ProbePort = 7777

// Proto is a probe protocol.
type Proto string

const (
	TCP  Proto = "tcp"
	UDP  Proto = "udp"
	ICMP Proto = "icmp"
)

// Protos are the protocols the matrix probes.
var Protos = []Proto{TCP, UDP, ICMP}

// echoServer answers TCP and UDP probes in one namespace with the source
// address it saw, which lets a probe tell whether it was masqueraded.
type echoServer struct {
	tcp net.Listener
	udp net.PacketConn
	wg  sync.WaitGroup
}

// startEcho opens both sockets inside the namespace at path; they stay
// bound to it, so serving them from any goroutine is fine.
func startEcho(path string) (*echoServer, error) {
	s := &echoServer{}
	err := InNS(path, func() error {
		var err error
		if s.tcp, err = net.Listen("tcp4", fmt.Sprintf(":%d", ProbePort)); err != nil {
			return fmt.Errorf("listen tcp in %s: %w", path, err)
		}
		if s.udp, err = net.ListenPacket("udp4", fmt.Sprintf(":%d", ProbePort)); err != nil {
			s.tcp.Close()
			return fmt.Errorf("listen udp in %s: %w", path, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.wg.Add(2)
	go s.serveTCP()
	go s.serveUDP()
	return s, nil
}

func (s *echoServer) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.tcp.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
			fmt.Fprintf(c, "%s\n", host)
		}()
	}
}

func (s *echoServer) serveUDP() {
	defer s.wg.Done()
	buf := make([]byte, 2048)
	for {
		_, from, err := s.udp.ReadFrom(buf)
		if err != nil {
			return
		}
		host, _, _ := net.SplitHostPort(from.String())
		s.udp.WriteTo([]byte(host+"\n"), from)
	}
}

func (s *echoServer) Close() {
	s.tcp.Close()
	s.udp.Close()
	s.wg.Wait()
}

// ProbeResult is one probe's outcome.
type ProbeResult struct {
	OK     bool       // an answer came back
	SeenAs netip.Addr // the source address the server saw (TCP, UDP)
	Err    error
}

// Probe sends one request from the namespace at srcNS to dst and waits at
// most timeout for the answer.
func Probe(ctx context.Context, srcNS string, dst netip.Addr, proto Proto, timeout time.Duration) ProbeResult {
	switch proto {
	case TCP:
		return probeTCP(srcNS, dst, timeout)
	case UDP:
		return probeUDP(srcNS, dst, timeout)
	case ICMP:
		return probeICMP(srcNS, dst, timeout)
	}
	return ProbeResult{Err: fmt.Errorf("unknown protocol %q", proto)}
}

func probeTCP(srcNS string, dst netip.Addr, timeout time.Duration) ProbeResult {
	var c net.Conn
	err := InNS(srcNS, func() error {
		var err error
		c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(dst, ProbePort).String(), timeout)
		return err
	})
	if err != nil {
		return ProbeResult{Err: err}
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintf(c, "probe\n"); err != nil {
		return ProbeResult{Err: err}
	}
	return readSeen(bufio.NewReader(c).ReadString('\n'))
}

func probeUDP(srcNS string, dst netip.Addr, timeout time.Duration) ProbeResult {
	var c net.Conn
	err := InNS(srcNS, func() error {
		var err error
		c, err = net.Dial("udp4", netip.AddrPortFrom(dst, ProbePort).String())
		return err
	})
	if err != nil {
		return ProbeResult{Err: err}
	}
	defer c.Close()
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 256)
	// UDP may lose the first datagram while a neighbour resolves: retry.
	for time.Now().Before(deadline) {
		c.Write([]byte("probe\n"))
		c.SetReadDeadline(minTime(deadline, time.Now().Add(300*time.Millisecond)))
		n, err := c.Read(buf)
		if err == nil {
			return readSeen(string(buf[:n]), nil)
		}
	}
	return ProbeResult{Err: errors.New("no UDP answer")}
}

func probeICMP(srcNS string, dst netip.Addr, timeout time.Duration) ProbeResult {
	var pc *icmp.PacketConn
	err := InNS(srcNS, func() error {
		var err error
		pc, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	})
	if err != nil {
		return ProbeResult{Err: err}
	}
	defer pc.Close()
	id := rand.IntN(0xffff)
	msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: 1, Data: []byte("weir-lab")}}
	b, _ := msg.Marshal(nil)
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 1500)
	for time.Now().Before(deadline) {
		if _, err := pc.WriteTo(b, &net.IPAddr{IP: net.IP(dst.AsSlice())}); err != nil {
			return ProbeResult{Err: err}
		}
		pc.SetReadDeadline(minTime(deadline, time.Now().Add(500*time.Millisecond)))
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				break
			}
			m, err := icmp.ParseMessage(1, buf[:n])
			if err != nil || m.Type != ipv4.ICMPTypeEchoReply {
				continue
			}
			if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id && from.(*net.IPAddr).IP.Equal(net.IP(dst.AsSlice())) {
				return ProbeResult{OK: true}
			}
		}
	}
	return ProbeResult{Err: errors.New("no echo reply")}
}

func readSeen(line string, err error) ProbeResult {
	if err != nil {
		return ProbeResult{Err: err}
	}
	a, perr := netip.ParseAddr(strings.TrimSpace(line))
	if perr != nil {
		return ProbeResult{Err: fmt.Errorf("bad echo %q", line)}
	}
	return ProbeResult{OK: true, SeenAs: a}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// InNS runs f in the network namespace at path on a locked thread.
// Sockets f opens stay in that namespace and may be used from anywhere.
func InNS(path string, f func() error) error {
	target, err := ns.GetNS(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer target.Close()
	return target.Do(func(ns.NetNS) error { return f() })
}

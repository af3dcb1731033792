package connectivity

import (
	"context"
	"net"
	"testing"
	"time"
)

// startProbe serves on loopback ports of its own and returns them.
func startProbe(t *testing.T) (tcpAddr, udpAddr string) {
	t.Helper()
	t.Setenv("POD_NAME", "server-x")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, pc) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return ln.Addr().String(), pc.LocalAddr().String()
}

// closedPort is a loopback port nothing listens on (for TCP or UDP).
func closedPort(t *testing.T, network string) string {
	t.Helper()
	var addr string
	switch network {
	case "tcp":
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr = ln.Addr().String()
		ln.Close()
	default:
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr = pc.LocalAddr().String()
		pc.Close()
	}
	return addr
}

func TestProbeAnswersWithItsNameAndTheClient(t *testing.T) {
	tcpAddr, udpAddr := startProbe(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for name, r := range map[string]Result{
		"http":    DialTCP(ctx, tcpAddr),
		"udp":     DialUDP(ctx, udpAddr, 2*time.Second),
		"connect": Connect(ctx, tcpAddr),
	} {
		if !r.OK || r.Outcome != "answered" {
			t.Errorf("%s: %+v, want answered", name, r)
			continue
		}
		if name == "connect" {
			continue
		}
		if r.Answer == nil || r.Answer.Pod != "server-x" {
			t.Errorf("%s: answer %+v, want from server-x", name, r.Answer)
			continue
		}
		if host, _, err := net.SplitHostPort(r.Answer.Client); err != nil || host != "127.0.0.1" {
			t.Errorf("%s: the server saw the client as %q, want 127.0.0.1:port", name, r.Answer.Client)
		}
	}
}

// A closed port is "refused" at once, over TCP and UDP (the ICMP port
// unreachable reaching the connected socket): what a Reject rule gives,
// told apart from a timeout, what a Deny gives.
func TestProbeTellsRefusalFromTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if r := DialTCP(ctx, closedPort(t, "tcp")); r.OK || r.Outcome != "refused" {
		t.Errorf("HTTP to a closed port: %+v, want refused", r)
	}
	if r := Connect(ctx, closedPort(t, "tcp")); r.OK || r.Outcome != "refused" {
		t.Errorf("connect to a closed port: %+v, want refused", r)
	}
	if r := DialUDP(ctx, closedPort(t, "udp"), 2*time.Second); r.OK || r.Outcome != "refused" {
		t.Errorf("UDP to a closed port: %+v, want refused", r)
	}
	// A UDP server that never answers: a timeout within the budget.
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	start := time.Now()
	sctx, scancel := context.WithTimeout(context.Background(), 800*time.Millisecond)
	defer scancel()
	if r := DialUDP(sctx, silent.LocalAddr().String(), 800*time.Millisecond); r.OK || r.Outcome != "timeout" {
		t.Errorf("UDP to a silent port: %+v, want timeout", r)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the UDP timeout took %v for a budget of 800ms", took)
	}
	if r := Lookup(ctx, "localhost"); !r.OK || len(r.Resolved) == 0 {
		t.Errorf("lookup of localhost: %+v", r)
	}
	if r := Lookup(ctx, "no-such-name.invalid"); r.OK || r.Outcome != "unresolved" {
		t.Errorf("lookup of a .invalid name: %+v, want unresolved", r)
	}
}

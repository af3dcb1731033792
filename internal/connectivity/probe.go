package connectivity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"
)

// Answer is what a probe server says to every client.
type Answer struct {
	// Pod is the server's name ($POD_NAME, else the host name).
	Pod string `json:"pod"`
	// Client is the client's address as the server saw it.
	Client string `json:"client"`
}

func podName() string {
	if n := os.Getenv("POD_NAME"); n != "" {
		return n
	}
	n, _ := os.Hostname()
	return n
}

// Serve answers HTTP on tcpAddr and datagrams on udpAddr (either may be
// empty) with the pod's name and the client's address until ctx ends.
func Serve(ctx context.Context, tcpAddr, udpAddr string) error {
	var (
		ln  net.Listener
		pc  net.PacketConn
		err error
	)
	if tcpAddr != "" {
		if ln, err = net.Listen("tcp", tcpAddr); err != nil {
			return fmt.Errorf("listen on TCP %s: %w", tcpAddr, err)
		}
	}
	if udpAddr != "" {
		if pc, err = net.ListenPacket("udp", udpAddr); err != nil {
			if ln != nil {
				ln.Close()
			}
			return fmt.Errorf("listen on UDP %s: %w", udpAddr, err)
		}
	}
	return serve(ctx, ln, pc)
}

// serve answers on ln and pc (either may be nil) until ctx ends, and
// closes them.
func serve(ctx context.Context, ln net.Listener, pc net.PacketConn) error {
	errs := make(chan error, 2)
	if ln != nil {
		srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(Answer{Pod: podName(), Client: r.RemoteAddr})
		})}
		go func() { errs <- srv.Serve(ln) }()
		defer srv.Close()
	}
	if pc != nil {
		defer pc.Close()
		go func() { errs <- echoUDP(pc) }()
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-errs:
		return err
	}
}

// echoUDP answers every datagram with an Answer.
func echoUDP(pc net.PacketConn) error {
	buf := make([]byte, 2048)
	for {
		_, from, err := pc.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("read UDP: %w", err)
		}
		b, _ := json.Marshal(Answer{Pod: podName(), Client: from.String()})
		pc.WriteTo(b, from)
	}
}

// Result is what one attempt (`weir-agent probe dial`) gave; the test
// decodes it from the probe pod's output.
type Result struct {
	OK bool `json:"ok"`
	// Outcome: "answered", "refused", "timeout", "unresolved" or "error".
	Outcome string `json:"outcome"`
	Error   string `json:"error,omitempty"`
	// Answer is the server's, when it answered.
	Answer *Answer `json:"answer,omitempty"`
	// Resolved are the addresses a --dns lookup gave.
	Resolved []string `json:"resolved,omitempty"`
	Millis   float64  `json:"ms"`
}

// DialTCP sends one HTTP request to addr.
func DialTCP(ctx context.Context, addr string) Result {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
	if err != nil {
		return Result{Outcome: "error", Error: err.Error()}
	}
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return failed(err)
	}
	defer resp.Body.Close()
	return answered(resp.Body)
}

// Connect opens a TCP connection to addr and closes it: for ends that
// speak no probe's HTTP (a node's kubelet, a host outside the cluster).
func Connect(ctx context.Context, addr string) Result {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return failed(err)
	}
	conn.Close()
	return Result{OK: true, Outcome: "answered"}
}

// DialUDP sends a datagram to addr until one is answered or timeout.
func DialUDP(ctx context.Context, addr string, timeout time.Duration) Result {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return failed(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(timeout))
	// Datagrams may be lost on the way: a few tries within the timeout.
	buf := make([]byte, 2048)
	for {
		if _, err := conn.Write([]byte("probe")); err != nil {
			return failed(err)
		}
		conn.SetReadDeadline(time.Now().Add(timeout / 4))
		n, err := conn.Read(buf)
		if err == nil {
			return answered(strings.NewReader(string(buf[:n])))
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() || ctx.Err() != nil {
			return failed(err)
		}
	}
}

// Lookup resolves name with the pod's resolver.
func Lookup(ctx context.Context, name string) Result {
	addrs, err := net.DefaultResolver.LookupHost(ctx, name)
	if err != nil {
		r := failed(err)
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			r.Outcome = "unresolved"
		}
		return r
	}
	return Result{OK: true, Outcome: "answered", Resolved: addrs}
}

func answered(body io.Reader) Result {
	var a Answer
	if err := json.NewDecoder(io.LimitReader(body, 4096)).Decode(&a); err != nil {
		return Result{Outcome: "error", Error: "not a probe's answer: " + err.Error()}
	}
	return Result{OK: true, Outcome: "answered", Answer: &a}
}

// failed classifies an error the way the test reports it: a refusal (a
// reset or ICMP unreachable: a Reject rule, no listener) differs from a
// timeout (a Deny rule dropping silently).
func failed(err error) Result {
	r := Result{Outcome: "error", Error: err.Error()}
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		r.Outcome = "refused"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		r.Outcome = "timeout"
	}
	return r
}

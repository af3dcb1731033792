package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"
)

// tcpCRR measures new TCP connections per second: wrk sends every request
// on a connection of its own ("Connection: close") to a minimal HTTP
// server, so each request is a handshake, one exchange and a close. This
// is the load where per-connection work (conntrack entries, verdict
// events, flow records) shows; streams and request/response over one
// connection barely see it.
func tcpCRR(ctx context.Context, clientNS, serverNS, dst string, d time.Duration) (float64, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, fmt.Errorf("find the bench binary to serve HTTP: %w", err)
	}
	port := nextPort()
	srv, err := startServer(ctx, serverNS, serverCPU, self, "http-server", "--port", port)
	if err != nil {
		return 0, err
	}
	defer srv.stop()
	url := fmt.Sprintf("http://%s/", net.JoinHostPort(dst, port))
	args := []string{"wrk", "-t1", "-c4", "-d", fmt.Sprintf("%ds", int(d.Seconds())), "-H", "Connection: close", url}
	out, err := retryRefused(func() ([]byte, error) { return inNS(ctx, clientNS, clientCPU, args...).CombinedOutput() })
	if err != nil {
		return 0, fmt.Errorf("wrk: %w: %s", err, out)
	}
	m := wrkRPS.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no Requests/sec in wrk output: %s", out)
	}
	if e := wrkErrors.FindSubmatch(out); e != nil && string(e[1]) != "0" {
		return 0, fmt.Errorf("wrk: %s connect errors: %s", e[1], out)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// newHTTPServerCommand is the server tcpCRR runs in the server's
// namespace: one short answer per connection, no keep-alive.
func newHTTPServerCommand() *cobra.Command {
	var port int
	var clientCloses bool
	cmd := &cobra.Command{
		Use:    "http-server",
		Short:  "Serve a minimal HTTP answer (the connection-rate test's server)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if clientCloses {
				return serveClientCloses(cmd.Context(), port)
			}
			s := &http.Server{
				Addr:              ":" + strconv.Itoa(port),
				ReadHeaderTimeout: 5 * time.Second,
				Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
					w.Header().Set("Connection", "close")
					_, _ = w.Write([]byte("ok\n"))
				}),
			}
			s.SetKeepAlivesEnabled(false)
			go func() {
				<-cmd.Context().Done()
				s.Close()
			}()
			if err := s.ListenAndServe(); err != http.ErrServerClosed {
				return err
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&port, "port", 0, "TCP port to listen on")
	cmd.Flags().BoolVar(&clientCloses, "client-closes", false, "answer, then wait for the client to close first, so the server keeps no TIME_WAIT (see serveClientCloses)")
	return cmd
}

// httpAnswer is the whole answer to any request.
const httpAnswer = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"

// serveClientCloses answers one request per connection and leaves the
// close to the client. The services scenario needs it: when the server
// closes first, its TIME_WAIT sockets remember each client port for a
// minute, and a client reaching the same server once through a ClusterIP
// that the stack translates (its timestamps and sequence numbers drawn for
// the ClusterIP) and once by the pod's address (drawn for that) looks, on
// a reused port, like an old duplicate: the server answers the new SYN
// with the old connection's ACK and the client waits a second to retry.
// That is the benchmark's doing, not the proxy's, so no TIME_WAIT is kept
// where the ports meet.
func serveClientCloses(ctx context.Context, port int) error {
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go answerThenWaitForClose(c)
	}
}

// answerThenWaitForClose reads one request's head, answers it and closes
// only after the client did (or after ten seconds).
func answerThenWaitForClose(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4096)
	var head []byte
	for !bytes.Contains(head, []byte("\r\n\r\n")) {
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		head = append(head, buf[:n]...)
	}
	if _, err := io.WriteString(c, httpAnswer); err != nil {
		return
	}
	for {
		if _, err := c.Read(buf); err != nil {
			return // EOF: the client closed first
		}
	}
}

package main

import (
	"context"
	"fmt"
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
	cmd := &cobra.Command{
		Use:    "http-server",
		Short:  "Serve a minimal HTTP answer (the connection-rate test's server)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
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
	return cmd
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/weirnet/weir/internal/connectivity"
)

// The probe is what `weir connectivity test` runs in its pods: the
// agent's image is on every node already, so the test needs no other
// image, registry or shell. `probe serve` answers TCP (HTTP) and UDP with
// who answered and whom it saw; `probe dial` makes one attempt and prints
// what happened as JSON.
func newProbeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:    "probe",
		Short:  "The connectivity test's server and client (weir connectivity test runs them in its pods)",
		Hidden: true,
	}
	cmd.AddCommand(newProbeServeCommand(), newProbeDialCommand())
	return cmd
}

func newProbeServeCommand() *cobra.Command {
	var tcpAddr, udpAddr string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Answer HTTP on --tcp and datagrams on --udp with the pod's name and the client's address",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return connectivity.Serve(ctx, tcpAddr, udpAddr)
		},
	}
	cmd.Flags().StringVar(&tcpAddr, "tcp", ":8080", "HTTP listen address (empty: none)")
	cmd.Flags().StringVar(&udpAddr, "udp", ":8081", "UDP listen address (empty: none)")
	return cmd
}

func newProbeDialCommand() *cobra.Command {
	var tcpAddr, connectAddr, udpAddr, dnsName string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "dial",
		Short: "One HTTP request to --tcp, one connection to --connect, one datagram to --udp, or one lookup of --dns; print the outcome as JSON",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n := 0
			for _, s := range []string{tcpAddr, connectAddr, udpAddr, dnsName} {
				if s != "" {
					n++
				}
			}
			if n != 1 {
				return errors.New("want exactly one of --tcp, --connect, --udp and --dns")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			start := time.Now()
			var r connectivity.Result
			switch {
			case tcpAddr != "":
				r = connectivity.DialTCP(ctx, tcpAddr)
			case connectAddr != "":
				r = connectivity.Connect(ctx, connectAddr)
			case udpAddr != "":
				r = connectivity.DialUDP(ctx, udpAddr, timeout)
			default:
				r = connectivity.Lookup(ctx, dnsName)
			}
			r.Millis = float64(time.Since(start).Microseconds()) / 1000
			return json.NewEncoder(cmd.OutOrStdout()).Encode(r)
		},
	}
	cmd.Flags().StringVar(&tcpAddr, "tcp", "", "host:port to send one HTTP request to")
	cmd.Flags().StringVar(&connectAddr, "connect", "", "host:port to open one TCP connection to (and close)")
	cmd.Flags().StringVar(&udpAddr, "udp", "", "host:port to send one datagram to")
	cmd.Flags().StringVar(&dnsName, "dns", "", "name to look up with the pod's resolver")
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "how long the attempt may take")
	return cmd
}

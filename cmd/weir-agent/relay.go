package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/spf13/cobra"
)

// newRelayCommand is `weir-agent relay`: standard input to the agent's
// socket and its answer to standard output. The weir CLI runs it in an
// agent pod through the Kubernetes API (exec), so that `weir status`,
// `observe` and the rest reach every node's agent of a cluster from
// anywhere a kubeconfig works, with the API server's authentication and
// RBAC (pods/exec in the agents' namespace) in front of the socket.
func newRelayCommand() *cobra.Command {
	var socket string
	cmd := &cobra.Command{
		Use:    "relay",
		Short:  "Relay standard input and output to the agent's socket (what `weir status --kubeconfig` runs in agent pods)",
		Args:   cobra.NoArgs,
		Hidden: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return relay(socket, os.Stdin, os.Stdout)
		},
	}
	cmd.Flags().StringVar(&socket, "socket", defaultSocket(), "unix socket of the local API (default from $WEIR_AGENT_SOCKET)")
	return cmd
}

// relay copies in to the socket until in ends (then half-closes the
// connection, so the agent sees the request's end) and the agent's answer
// to out until the agent closes.
func relay(socket string, in io.Reader, out io.Writer) error {
	conn, err := net.Dial("unix", socket)
	if err != nil {
		return fmt.Errorf("reach the agent at %s: %w", socket, err)
	}
	defer conn.Close()
	sent := make(chan error, 1)
	go func() {
		_, err := io.Copy(conn, in)
		if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			err = errors.Join(err, cw.CloseWrite())
		}
		sent <- err
	}()
	if _, err := io.Copy(out, conn); err != nil {
		return fmt.Errorf("relay the agent's answer: %w", err)
	}
	// The agent answered and closed: what is still being sent (nothing,
	// for one HTTP request) no longer matters.
	select {
	case err := <-sent:
		if err != nil && !errors.Is(err, net.ErrClosed) {
			return fmt.Errorf("relay to the agent: %w", err)
		}
	default:
	}
	return nil
}

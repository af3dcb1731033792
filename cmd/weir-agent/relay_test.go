package main

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weirnet/weir/internal/api"
)

// A client whose every request is relayed over a stream (as `weir status
// --kubeconfig` relays them through an exec into an agent pod) gets the
// agent's answers, one relay per request.
func TestRelayCarriesAPIRequests(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc(api.PathHealth, func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("{}")) })
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	defer srv.Close()

	relays := 0
	c := api.NewDialClient("a relay", func(ctx context.Context) (net.Conn, error) {
		relays++
		ours, theirs := net.Pipe()
		go func() {
			defer theirs.Close()
			if err := relay(sock, theirs, theirs); err != nil {
				t.Errorf("relay: %v", err)
			}
		}()
		return ours, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 3 {
		if err := c.Health(ctx); err != nil {
			t.Fatalf("health through the relay: %v", err)
		}
	}
	if relays != 3 {
		t.Errorf("%d relays for 3 requests, want one each", relays)
	}
}

func TestRelayNamesAMissingSocket(t *testing.T) {
	err := relay(filepath.Join(t.TempDir(), "none.sock"), nil, nil)
	if err == nil {
		t.Fatal("relay to a missing socket succeeded")
	}
	if want := "reach the agent at"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
}

package agent

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"testing"

	"github.com/weirnet/weir/internal/service"
)

// freePort finds a loopback TCP port nobody listens on.
func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

func probe(t *testing.T, port uint16) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(int(port)) + "/healthz")
	if err != nil {
		t.Fatalf("probe %d: %v", port, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var body map[string]any
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("probe %d: body %q: %v", port, b, err)
	}
	return resp.StatusCode, body
}

// TestHealthCheckNodePorts: a health check node port answers 200 while the
// node has a ready endpoint of its Service and 503 without, with the count
// and the Service in its body; a port no longer wanted is closed; a port
// taken by someone else is an error that names it.
func TestHealthCheckNodePorts(t *testing.T) {
	h := newHealthCheckServers("127.0.0.1", slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer h.close()
	port := freePort(t)
	if err := h.sync(map[uint16]service.HealthCheck{port: {Namespace: "shop", Name: "web", LocalEndpoints: 2}}); err != nil {
		t.Fatal(err)
	}
	code, body := probe(t, port)
	if code != http.StatusOK || body["localEndpoints"] != float64(2) || body["service"].(map[string]any)["name"] != "web" {
		t.Errorf("with 2 local endpoints: %d %v, want 200 and the count", code, body)
	}
	if err := h.sync(map[uint16]service.HealthCheck{port: {Namespace: "shop", Name: "web"}}); err != nil {
		t.Fatal(err)
	}
	if code, body := probe(t, port); code != http.StatusServiceUnavailable || body["localEndpoints"] != float64(0) {
		t.Errorf("with no local endpoint: %d %v, want 503", code, body)
	}
	if err := h.sync(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(int(port))); err == nil {
		t.Error("the port of a removed health check still answers")
	}

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	busy := uint16(taken.Addr().(*net.TCPAddr).Port)
	if err := h.sync(map[uint16]service.HealthCheck{busy: {Namespace: "shop", Name: "web"}}); err == nil {
		t.Error("a taken port was reported open")
	}
}

package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/weirnet/weir/internal/service"
)

// healthCheckServers answer the health check node ports of
// externalTrafficPolicy: Local LoadBalancer Services, as kube-proxy does
// where it runs: HTTP on the port, 200 while the node has a ready
// endpoint of the Service and 503 without, with the count in a JSON body.
// A cloud load balancer probes them to send traffic only to nodes that
// serve it.
type healthCheckServers struct {
	// addr is the host the ports are opened on ("" for every address).
	addr string
	log  *slog.Logger

	mu      sync.Mutex
	servers map[uint16]*healthCheckServer
}

type healthCheckServer struct {
	srv *http.Server
	mu  sync.Mutex
	hc  service.HealthCheck
}

func newHealthCheckServers(addr string, log *slog.Logger) *healthCheckServers {
	return &healthCheckServers{addr: addr, log: log, servers: map[uint16]*healthCheckServer{}}
}

// sync opens the ports of want that are not open, updates the answers of
// those that are, and closes the rest. A port that cannot be opened (taken
// by another process) is reported and tried again on the next sync.
func (h *healthCheckServers) sync(want map[uint16]service.HealthCheck) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var errs []error
	for port, s := range h.servers {
		if _, ok := want[port]; !ok {
			_ = s.srv.Close()
			delete(h.servers, port)
		}
	}
	for port, hc := range want {
		if s, ok := h.servers[port]; ok {
			s.mu.Lock()
			s.hc = hc
			s.mu.Unlock()
			continue
		}
		s, err := h.open(port, hc)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		h.servers[port] = s
	}
	return errors.Join(errs...)
}

func (h *healthCheckServers) open(port uint16, hc service.HealthCheck) (*healthCheckServer, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(h.addr, strconv.Itoa(int(port))))
	if err != nil {
		return nil, fmt.Errorf("health check node port %d of %s/%s: %w", port, hc.Namespace, hc.Name, err)
	}
	s := &healthCheckServer{hc: hc}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			h.log.Error("health check node port", "port", port, "err", err)
		}
	}()
	return s, nil
}

// ServeHTTP answers any path, as kube-proxy's does.
func (s *healthCheckServer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	hc := s.hc
	s.mu.Unlock()
	status := http.StatusOK
	if hc.LocalEndpoints == 0 {
		status = http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"service":             map[string]string{"namespace": hc.Namespace, "name": hc.Name},
		"localEndpoints":      hc.LocalEndpoints,
		"serviceProxyHealthy": true,
	})
}

// close shuts every port.
func (h *healthCheckServers) close() {
	_ = h.sync(nil)
}

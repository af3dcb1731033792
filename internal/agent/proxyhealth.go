package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// proxyHealth answers where kube-proxy's own endpoints are when the agent
// replaces it, so what probes kube-proxy keeps working: /healthz and
// /livez on the healthz address (cloud load balancers of
// externalTrafficPolicy: Cluster Services probe every node's
// :10256/healthz to send traffic only to nodes that proxy), and
// /proxyMode on the status address (what mode the node's Service proxy
// runs in).
type proxyHealth struct {
	log *slog.Logger

	mu sync.Mutex
	// lastUpdated is when the service maps last matched the cluster's
	// Services (written, or found unchanged); healthy says the last
	// attempt did.
	lastUpdated time.Time
	healthy     bool
	servers     []*http.Server
	// addrs are the listeners' addresses: healthz, then status.
	addrs []net.Addr
}

// proxyMode is what /proxyMode answers: kube-proxy's says iptables,
// nftables or ipvs.
const proxyMode = "ebpf"

// openProxyHealth listens on healthzAddr and statusAddr (either may be
// empty: not served). A taken port fails: most often kube-proxy still runs
// on the node, which must not run beside the replacement.
func openProxyHealth(healthzAddr, statusAddr string, log *slog.Logger) (_ *proxyHealth, retErr error) {
	p := &proxyHealth{log: log}
	defer func() {
		if retErr != nil {
			p.close()
		}
	}()
	if healthzAddr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", p.serveHealthz)
		mux.HandleFunc("/livez", p.serveHealthz)
		if err := p.listen(healthzAddr, mux); err != nil {
			return nil, fmt.Errorf("kube-proxy healthz address: %w (does kube-proxy still run on this node? it must not beside --kube-proxy-replacement)", err)
		}
	}
	if statusAddr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = io.WriteString(w, proxyMode)
		})
		if err := p.listen(statusAddr, mux); err != nil {
			return nil, fmt.Errorf("kube-proxy status address: %w (does kube-proxy still run on this node? it must not beside --kube-proxy-replacement)", err)
		}
	}
	return p, nil
}

func (p *proxyHealth) listen(addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	p.servers, p.addrs = append(p.servers, srv), append(p.addrs, ln.Addr())
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.log.Error("kube-proxy health endpoint", "addr", addr, "err", err)
		}
	}()
	return nil
}

// record notes the outcome of bringing the service maps in line.
func (p *proxyHealth) record(ok bool, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.healthy = ok
	if ok {
		p.lastUpdated = now
	}
}

// serveHealthz answers as kube-proxy's health server: 200 while the node
// proxies the cluster's Services as they are, 503 before the first sync
// and while the maps could not be written, with the times in JSON.
func (p *proxyHealth) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	p.mu.Lock()
	last, healthy := p.lastUpdated, p.healthy
	p.mu.Unlock()
	status := http.StatusOK
	if !healthy || last.IsZero() {
		status = http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"lastUpdated":  last,
		"currentTime":  time.Now(),
		"nodeEligible": true,
	})
}

func (p *proxyHealth) close() {
	for _, s := range p.servers {
		_ = s.Close()
	}
}

package agent

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestProxyHealthAnswersAsKubeProxy: /healthz and /livez say 503 until the
// service maps first match the cluster, 200 with lastUpdated after, 503
// again while a write fails; /proxyMode names the mode; a taken port fails
// the start, naming kube-proxy.
func TestProxyHealthAnswersAsKubeProxy(t *testing.T) {
	p, err := openProxyHealth("127.0.0.1:0", "127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	healthz, status := "http://"+p.addrs[0].String(), "http://"+p.addrs[1].String()
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get(healthz + "/healthz"); code != http.StatusServiceUnavailable {
		t.Errorf("before the first sync: %d, want 503", code)
	}
	synced := time.Date(2026, 11, 25, 18, 0, 0, 0, time.UTC)
	p.record(true, synced)
	for _, path := range []string{"/healthz", "/livez"} {
		code, body := get(healthz + path)
		var doc struct {
			LastUpdated  time.Time `json:"lastUpdated"`
			NodeEligible bool      `json:"nodeEligible"`
		}
		if err := json.Unmarshal([]byte(body), &doc); err != nil || code != http.StatusOK || !doc.LastUpdated.Equal(synced) || !doc.NodeEligible {
			t.Errorf("%s after a sync: %d %s (%v), want 200 with lastUpdated %v", path, code, body, err, synced)
		}
	}
	p.record(false, synced.Add(time.Minute))
	if code, body := get(healthz + "/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "2026-11-25T18:00:00Z") {
		t.Errorf("while writes fail: %d %s, want 503 naming the last good sync", code, body)
	}
	if code, body := get(status + "/proxyMode"); code != http.StatusOK || body != proxyMode {
		t.Errorf("/proxyMode: %d %q, want 200 %q", code, body, proxyMode)
	}

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	if _, err := openProxyHealth(taken.Addr().String(), "", slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil || !strings.Contains(err.Error(), "kube-proxy") {
		t.Errorf("a taken healthz port: %v, want an error naming kube-proxy", err)
	}
}

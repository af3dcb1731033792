package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weirnet/weir/internal/api"
)

// healthyStatus is an agent synced with the API server, its policy
// loaded, its maps far from full.
func healthyStatus() *api.Status {
	return &api.Status{
		Node: "n1", Ready: true, Mode: "vxlan",
		Kubernetes: &api.KubeStatus{Synced: true},
		Policy:     &api.PolicyStatus{Maps: map[string]api.MapFill{"policy": {Entries: 10, Capacity: 1000}}},
		Services:   &api.ServicesSummary{},
	}
}

func TestStatusProblems(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*api.Status)
		want   string
	}{
		{"healthy", func(*api.Status) {}, ""},
		{"policy that does not compile fails closed, as meant", func(s *api.Status) { s.Policy.CompileErrors = []string{"ns/p: bad"} }, ""},
		{"not ready", func(s *api.Status) { s.Ready = false }, "agent not ready"},
		{"not synced", func(s *api.Status) { s.Kubernetes.Synced = false }, "not yet synced with the API server"},
		{"node report", func(s *api.Status) { s.Kubernetes.ReportError = "forbidden" }, "cannot report to its Node: forbidden"},
		{"policy load", func(s *api.Status) { s.Policy.Error = "map full" }, "last policy load failed (its endpoints fail closed): map full"},
		{"map nearly full", func(s *api.Status) { s.Policy.Maps["policy"] = api.MapFill{Entries: 900, Capacity: 1000} }, "map policy 900/1000 full"},
		{"service write", func(s *api.Status) { s.Services.Error = "E2BIG" }, "last Service map write failed: E2BIG"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := healthyStatus()
			tc.mutate(s)
			got := strings.Join(statusProblems(s), "; ")
			if got != tc.want {
				t.Errorf("problems %q, want %q", got, tc.want)
			}
		})
	}
}

// TestStatusCommandFailsOnAnUnhealthyAgent runs `weir status` against an
// agent API on a socket: a healthy agent prints "health ok" and exits 0;
// one whose policy load failed prints why and exits with errUnhealthy,
// in the table and in JSON alike.
func TestStatusCommandFailsOnAnUnhealthyAgent(t *testing.T) {
	status := healthyStatus()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != api.PathStatus {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(status)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	exec := func(args ...string) (string, error) {
		cmd := NewStatusCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"--socket", sock}, args...))
		err := cmd.Execute()
		return out.String(), err
	}
	out, err := exec()
	if err != nil || !strings.Contains(out, "health ok") {
		t.Fatalf("healthy agent: %v\n%s", err, out)
	}
	status.Policy.Error = "policy map full"
	for _, args := range [][]string{nil, {"-o", "json"}} {
		out, err := exec(args...)
		if !errors.Is(err, errUnhealthy) || !strings.Contains(err.Error(), "policy map full") {
			t.Errorf("%v: error %v, want errUnhealthy naming the failed load", args, err)
		}
		if args == nil && !strings.Contains(out, "health UNHEALTHY: last policy load failed") {
			t.Errorf("the table does not say why:\n%s", out)
		}
	}
}

package cli

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	"github.com/weirnet/weir/internal/api"
)

func TestPrintServiceList(t *testing.T) {
	l := &api.ServiceList{Node: "n1", KubeProxyReplacement: true, InSync: false, Frontends: []api.ServiceFrontend{
		{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Protocol: "UDP", Service: "kube-system/kube-dns", State: "serving",
			Backends: []api.ServiceBackend{{Addr: netip.MustParseAddr("10.244.1.3"), Port: 53}, {Addr: netip.MustParseAddr("10.244.2.4"), Port: 53}}},
		{Addr: netip.MustParseAddr("10.96.0.20"), Port: 80, Protocol: "TCP", Service: "default/web", State: "refusing", AffinitySeconds: 30},
	}}
	var b bytes.Buffer
	if err := printServiceList(l, &b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("got %d lines, want a header, a column line and two rows:\n%s", len(lines), b.String())
	}
	for i, want := range [][]string{
		{"node n1", "2 Service addresses", "no kube-proxy", "NOT in sync"},
		{"FRONTEND", "FROM", "SERVICE", "STATE", "AFFINITY", "BACKENDS"},
		{"10.96.0.10:53/UDP", "kube-system/kube-dns", "serving", "10.244.1.3:53, 10.244.2.4:53"},
		{"10.96.0.20:80/TCP", "default/web", "refusing", "ClientIP 30s", "(none: new connections refused)"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("line %d %q lacks %q", i, lines[i], w)
			}
		}
	}
}

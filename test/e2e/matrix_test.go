package e2e

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/lab"
)

// TestConnectivityMatrix runs the lab's TCP/UDP/ICMP matrix in both
// inter-node modes: pod to pod on one node and across nodes, pod to its
// own and the other node, node to pod, pod to the outside host (which
// must see the node's address).
func TestConnectivityMatrix(t *testing.T) {
	for _, mode := range []datapath.Mode{datapath.ModeVXLAN, datapath.ModeNative} {
		t.Run(string(mode), func(t *testing.T) {
			st := newLab(t, 2, 2, mode)
			m, err := lab.Check(context.Background(), st, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			m.Print(&out)
			t.Logf("%s mode:\n%s", mode, out.String())
			if m.Probes != 96 {
				t.Fatalf("%d probes, want 96 (4 pods, 2 nodes, outside host, 3 protocols)", m.Probes)
			}
			if err := m.Err(); err != nil {
				t.Fatal(err)
			}
			// Pod-to-pod traffic must have bypassed the host: the datapath
			// counted deliveries straight into pods on both nodes.
			for _, n := range st.Nodes {
				s, err := n.Client().Status(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if s.Counters["redirect_local"] == 0 {
					t.Fatalf("node %s delivered nothing with redirect_peer: %v", n.Name, s.Counters)
				}
				remote := "redirect_tunnel"
				if mode == datapath.ModeNative {
					remote = "redirect_native"
				}
				if s.Counters[remote] == 0 {
					t.Fatalf("node %s sent nothing through %s: %v", n.Name, remote, s.Counters)
				}
				if s.Counters["drop_spoof"] != 0 || s.Counters["drop_malformed"] != 0 {
					t.Fatalf("node %s dropped packets: %v", n.Name, s.Counters)
				}
			}
		})
	}
}

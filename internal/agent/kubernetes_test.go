package agent

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/k8s"
)

func TestPeersFromSkipsNodesNotReadyForPods(t *testing.T) {
	s := k8s.Snapshot{Nodes: []k8s.Node{
		{Name: "n1", InternalIP: netip.MustParseAddr("10.0.0.1"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/24")}},
		{Name: "n2", InternalIP: netip.MustParseAddr("10.0.0.2")},                      // no CIDR yet
		{Name: "n3", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")}}, // no address yet
		{Name: "n4", InternalIP: netip.MustParseAddr("10.0.0.4"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00::/64"), netip.MustParsePrefix("10.244.4.0/24")}},
	}}
	got := peersFrom(s)
	if len(got) != 2 || got[0].Name != "n1" || got[1].Name != "n4" || got[1].PodCIDR != netip.MustParsePrefix("10.244.4.0/24") {
		t.Fatalf("peers %+v: want n1 and n4 (its IPv4 CIDR)", got)
	}
}

func TestSamePeersIgnoresSelfAndOrder(t *testing.T) {
	self := netip.MustParseAddr("10.0.0.1")
	p := func(name, ip, cidr string) api.Peer {
		return api.Peer{Name: name, NodeIP: netip.MustParseAddr(ip), PodCIDR: netip.MustParsePrefix(cidr)}
	}
	have := []api.Peer{p("n2", "10.0.0.2", "10.244.1.0/24"), p("n3", "10.0.0.3", "10.244.2.0/24")}
	for _, tc := range []struct {
		name string
		want []api.Peer
		same bool
	}{
		{"same, with self, reordered", []api.Peer{p("n3", "10.0.0.3", "10.244.2.0/24"), p("n1", "10.0.0.1", "10.244.0.0/24"), p("n2", "10.0.0.2", "10.244.1.0/24")}, true},
		{"one gone", []api.Peer{p("n2", "10.0.0.2", "10.244.1.0/24")}, false},
		{"one moved", []api.Peer{p("n2", "10.0.0.9", "10.244.1.0/24"), p("n3", "10.0.0.3", "10.244.2.0/24")}, false},
		{"one more", append(append([]api.Peer{}, have...), p("n4", "10.0.0.4", "10.244.3.0/24")), false},
	} {
		if got := samePeers(have, tc.want, self); got != tc.same {
			t.Errorf("%s: samePeers = %v", tc.name, got)
		}
	}
}

// TestClusterHashSeed: the seed comes from the kube-system namespace's
// UID, the same for every node reading it and different for another
// cluster; without the namespace there is none (0) and the agent goes on.
func TestClusterHashSeed(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cluster := func(uid string) *fake.Clientset {
		return fake.NewSimpleClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system", UID: types.UID(uid)}})
	}
	a := clusterHashSeed(ctx, cluster("2b6f0cc9-4a52-4a0f-9b1e-6c1d2e3f4a5b"), log)
	b := clusterHashSeed(ctx, cluster("2b6f0cc9-4a52-4a0f-9b1e-6c1d2e3f4a5b"), log)
	c := clusterHashSeed(ctx, cluster("9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a"), log)
	if a == 0 || a != b || a == c {
		t.Errorf("seeds %#x, %#x (same cluster) and %#x (another): want equal and nonzero, then different", a, b, c)
	}
	if s := clusterHashSeed(ctx, fake.NewSimpleClientset(), log); s != 0 {
		t.Errorf("seed without kube-system: %#x, want 0", s)
	}
}

// TestKeepCNIExclusive: a previous CNI's configuration is set aside at
// once, and again when its agent writes it back, until the context ends.
func TestKeepCNIExclusive(t *testing.T) {
	dir := t.TempDir()
	write := func() {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "00-previous.conflist"), []byte(`{"plugins":[]}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		keepCNIExclusive(ctx, dir, 20*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)))
		close(done)
	}()
	setAside := func() bool {
		_, err := os.Stat(filepath.Join(dir, "00-previous.conflist"))
		return os.IsNotExist(err)
	}
	for i := 0; i < 2; i++ {
		deadline := time.Now().Add(2 * time.Second)
		for !setAside() {
			if time.Now().After(deadline) {
				t.Fatalf("pass %d: the previous CNI's config is still in place", i)
			}
			time.Sleep(5 * time.Millisecond)
		}
		write() // its agent writes it back
	}
	cancel()
	<-done
}

package agent

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/weirnet/weir/internal/policy"
)

// tcpOnlyServer: onlyServer with TCP 8080.
func tcpOnlyServer() []*policy.ClusterPolicy {
	return onlyServer("tcp", npav1alpha2.ClusterNetworkPolicyProtocol{TCP: &npav1alpha2.ClusterNetworkPolicyProtocolTCP{
		DestinationPort: &npav1alpha2.Port{Number: 8080}}})
}

// An agent upgraded over an earlier version whose conntrack map had
// another size carries the tracked flows over: a connection open across
// the upgrade, whose packets pass only as a tracked flow (a TCP packet of
// no tracked flow that is no SYN is dropped), keeps talking, before and
// after the migration finishes, and nothing is dropped as flowless.
func TestUpgradeCarriesConntrackOver(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	client, server := n.newPod(), n.newPod()
	sr := n.clientAndServer(client, server, nil, tcpOnlyServer()...)
	listenIn(t, server, 8080, serveEcho, 0)
	var c net.Conn
	in(t, client, func() (err error) {
		c, err = net.DialTimeout("tcp4", sr.Address.Addr().String()+":8080", 3*time.Second)
		return err
	})
	defer c.Close()
	if err := echoes(c, "before"); err != nil {
		t.Fatal(err)
	}

	// The agent stops, and what it pinned is made to look like an earlier
	// version's: a conntrack map of half the size, holding the same flows.
	// (The programs still running keep the map they have.)
	n.stop()
	pin := filepath.Join(n.cfg.PinDir, "weir_ct")
	cur, err := ebpf.LoadPinnedMap(pin, nil)
	if err != nil {
		t.Fatal(err)
	}
	earlier, err := ebpf.NewMap(&ebpf.MapSpec{Name: "weir_ct", Type: cur.Type(), KeySize: cur.KeySize(), ValueSize: cur.ValueSize(),
		MaxEntries: cur.MaxEntries() / 2, Flags: cur.Flags()})
	if err != nil {
		t.Fatal(err)
	}
	defer earlier.Close()
	key, value := make([]byte, cur.KeySize()), make([]byte, cur.ValueSize())
	flows := 0
	for it := cur.Iterate(); it.Next(key, value); flows++ {
		if err := earlier.Put(key, value); err != nil {
			t.Fatal(err)
		}
	}
	if err := cur.Unpin(); err != nil {
		t.Fatal(err)
	}
	cur.Close()
	if err := earlier.Pin(pin); err != nil {
		t.Fatal(err)
	}
	if flows == 0 {
		t.Fatal("the connection is no tracked flow: this test would show nothing")
	}

	n.start(nil)
	if notes := strings.Join(n.dp.MapMigrationNotes(), "; "); !strings.Contains(notes, "weir_ct carried over") {
		t.Fatalf("migration notes %q: want the conntrack map carried over", notes)
	}
	before, err := n.dp.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if err := echoes(c, "across"); err != nil {
		t.Fatalf("the connection broke over the migration: %v", err)
	}
	if _, err := n.dp.FinishMapMigration(); err != nil {
		t.Fatal(err)
	}
	if err := echoes(c, "after"); err != nil {
		t.Fatalf("the connection broke after the migration finished: %v", err)
	}
	after, err := n.dp.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if d := after["drop_no_flow"] - before["drop_no_flow"]; d != 0 {
		t.Errorf("%d packets dropped as of no tracked flow across the migration", d)
	}
}

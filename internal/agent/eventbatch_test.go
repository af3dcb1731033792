package agent

import (
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/policy"
)

// TestEventBatchCountsByFlowNotBySourcePort: connections from many source
// ports to one destination are one entry with their count and time span;
// another verdict, rule or destination port is another entry; a drain
// starts anew.
func TestEventBatchCountsByFlowNotBySourcePort(t *testing.T) {
	b := newEventBatch()
	a, srv := netip.MustParseAddr("10.244.0.2"), netip.MustParseAddrPort("10.244.1.3:8080")
	t0 := time.Unix(1000, 0)
	ev := func(sport uint16, at time.Duration, v policy.Verdict, rule policy.RuleID) datapath.VerdictEvent {
		return datapath.VerdictEvent{Time: t0.Add(at), Ifindex: 7, Direction: policy.Egress, Verdict: v, Rule: rule,
			Src: netip.AddrPortFrom(a, sport), Dst: srv, Proto: 6}
	}
	for i := 0; i < 100; i++ {
		b.add(ev(uint16(40000+i), time.Duration(i)*time.Millisecond, policy.VerdictAllow, 5))
	}
	b.add(ev(41000, 0, policy.VerdictDeny, 0))
	b.add(ev(41001, 0, policy.VerdictAllow, 6))
	got := b.drain()
	if len(got) != 3 {
		t.Fatalf("%d entries, want 3: %+v", len(got), got)
	}
	for _, agg := range got {
		if agg.first.Rule == 5 && (agg.count != 100 || !agg.first.Time.Equal(t0) || !agg.last.Equal(t0.Add(99*time.Millisecond))) {
			t.Fatalf("the 100 connections aggregate to %+v, want count 100 from t0 to t0+99ms", agg)
		}
	}
	if again := b.drain(); len(again) != 0 {
		t.Fatalf("a second drain returned %d entries", len(again))
	}
}

// TestScanIsFoldedAndHistorySurvives: one source's denied probes of 20,000
// ports of a pod, and of 300 other addresses, become a handful of records
// that say how many ports and peers they fold; allowed connections are
// never folded; and the flow history recorded before the scan is still
// among the newest records afterwards.
func TestScanIsFoldedAndHistorySurvives(t *testing.T) {
	l := openTestFlowLog(t, t.TempDir())
	a := &Agent{flows: l, metrics: newMetrics(&metricsDatapath{}, l, slog.Default())}
	a.flowNames.Store(&flowNames{pods: map[int]string{7: "x/web", 8: "x/scanner"}, byIP: map[netip.Addr]string{},
		labels: map[policy.Identity][]string{}})
	t0 := time.Unix(1000, 0)
	client, web := netip.MustParseAddr("10.244.0.2"), netip.MustParseAddr("10.244.1.3")
	for i := 0; i < 10; i++ { // the history: ten allowed connections to ten ports
		a.flows.batch.add(datapath.VerdictEvent{Time: t0, Ifindex: 7, Direction: policy.Ingress, Verdict: policy.VerdictAllow, Rule: 5,
			Src: netip.AddrPortFrom(client, 40000), Dst: netip.AddrPortFrom(web, uint16(8000+i)), Proto: 6})
	}
	a.recordEventBatch()

	scanner := netip.MustParseAddr("10.244.0.66")
	for p := 1; p <= 20000; p++ {
		a.flows.batch.add(datapath.VerdictEvent{Time: t0.Add(time.Second), Ifindex: 7, Direction: policy.Ingress, Verdict: policy.VerdictDeny,
			Stage: policy.StageNetworkPolicyDefaultDeny, Src: netip.AddrPortFrom(scanner, 50000), Dst: netip.AddrPortFrom(web, uint16(p)), Proto: 6})
	}
	for h := 0; h < 300; h++ { // and, egress from a pod, 300 addresses on port 22
		dst := netip.AddrFrom4([4]byte{10, 244, 5, byte(h)})
		if h >= 256 {
			dst = netip.AddrFrom4([4]byte{10, 244, 6, byte(h - 256)})
		}
		a.flows.batch.add(datapath.VerdictEvent{Time: t0.Add(time.Second), Ifindex: 8, Direction: policy.Egress, Verdict: policy.VerdictDeny,
			Stage: policy.StageNetworkPolicyDefaultDeny, Src: netip.AddrPortFrom(scanner, 50001), Dst: netip.AddrPortFrom(dst, 22), Proto: 6, Peer: policy.Identity(300 + h)})
	}
	// Flows from outside sent to another node's backends, from one
	// client to many ports of a node, are no scan: forwarded, not denied.
	for p := 1; p <= 20; p++ {
		a.flows.batch.add(datapath.VerdictEvent{Time: t0.Add(time.Second), Direction: policy.Ingress, Verdict: policy.VerdictForwarded,
			Src: netip.AddrPortFrom(scanner, 50002), Dst: netip.AddrPortFrom(web, uint16(30000+p)), Proto: 6})
	}
	a.recordEventBatch()

	got, err := l.recent()
	if err != nil {
		t.Fatal(err)
	}
	var history, ports, peers, forwarded int
	for _, f := range got {
		switch {
		case f.Verdict == "allowed":
			history++
		case f.Verdict == "forwarded":
			forwarded++
		case f.PortsFolded > 0:
			ports++
			if f.PortsFolded != 20000 || f.Count != 20000 || f.Dst != web.String() {
				t.Errorf("port scan record %+v, want 20000 ports of %v folded", f, web)
			}
		case f.PeersFolded > 0:
			peers++
			if f.PeersFolded != 300 || f.Count != 300 || f.Dst != "" {
				t.Errorf("address scan record %+v, want 300 peers folded", f)
			}
		}
	}
	if history != 10 || ports != 1 || peers != 1 || forwarded != 20 || len(got) != 32 {
		t.Fatalf("%d records: %d of the history (want 10), %d port-scan (want 1), %d address-scan (want 1), %d forwarded (want 20, unfolded)",
			len(got), history, ports, peers, forwarded)
	}
}

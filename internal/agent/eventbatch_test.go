package agent

import (
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

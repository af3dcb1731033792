package agent

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/policy"
)

func TestFlowLogKeepsTheNewestAndFollows(t *testing.T) {
	l := newFlowLog()
	for i := 0; i < flowLogSize+10; i++ {
		l.add(api.Flow{Src: string(rune('a' + i%26)), PeerIdentity: uint32(i)})
	}
	got := l.recent()
	if len(got) != flowLogSize || got[0].PeerIdentity != 10 || got[len(got)-1].PeerIdentity != flowLogSize+9 {
		t.Fatalf("recent: %d flows from %d to %d, want %d from 10", len(got), got[0].PeerIdentity, got[len(got)-1].PeerIdentity, flowLogSize)
	}
	held, ch, cancel := l.follow()
	if len(held) != flowLogSize {
		t.Fatalf("follow held %d", len(held))
	}
	l.add(api.Flow{PeerIdentity: 99999})
	select {
	case f := <-ch:
		if f.PeerIdentity != 99999 {
			t.Fatalf("followed %+v", f)
		}
	case <-time.After(time.Second):
		t.Fatal("no flow followed")
	}
	cancel()
	// A follower that never reads loses flows; the log does not block.
	_, _, cancel = l.follow()
	defer cancel()
	for i := 0; i < followerBuffer+5; i++ {
		l.add(api.Flow{})
	}
	if l.missed.Load() != 5 {
		t.Fatalf("missed %d, want 5", l.missed.Load())
	}
}

func TestFlowNamesExplainVerdicts(t *testing.T) {
	a, b := netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("10.244.2.3")
	n := &flowNames{
		pods:   map[int]string{7: "demo/frontend"},
		byIP:   map[netip.Addr]string{b: "demo/backend"},
		labels: map[policy.Identity][]string{300: {"k8s:app=backend"}},
		rules:  map[policy.RuleID]policy.RuleRef{5: {Namespace: "demo", Name: "allow-web", Direction: policy.Egress, Index: 0}},
	}
	ev := datapath.VerdictEvent{Ifindex: 7, Direction: policy.Egress, Verdict: datapath.VerdictAllowed, Peer: 300, Rule: 5,
		Src: netip.AddrPortFrom(a, 40000), Dst: netip.AddrPortFrom(b, 80), Proto: 6}
	f := n.explain("n1", ev)
	if f.Pod != "demo/frontend" || f.Peer != "demo/backend" || f.Verdict != "allowed" || f.Proto != "TCP" ||
		f.Rule != "networkpolicy demo/allow-web egress[0]" || len(f.PeerLabels) != 1 {
		t.Fatalf("allowed flow explained as %+v", f)
	}
	ev.Verdict, ev.Rule = datapath.VerdictDenied, 0
	if f = n.explain("n1", ev); f.Verdict != "denied" || !strings.Contains(f.Rule, "default deny") {
		t.Fatalf("denied flow explained as %+v", f)
	}
	ev.Verdict, ev.Direction, ev.Ifindex = datapath.VerdictAllowed, policy.Ingress, 8
	if f = n.explain("n1", ev); f.Pod != "ifindex 8" || f.Peer != a.String() || !strings.Contains(f.Rule, "no policy selects") {
		t.Fatalf("unknown endpoint explained as %+v", f)
	}
}

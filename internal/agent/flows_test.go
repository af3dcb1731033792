package agent

import (
	"encoding/json"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/flowstore"
	"github.com/weirnet/weir/internal/policy"
)

// openTestFlowLog opens a flow log on dir whose window is written only
// when the log closes.
func openTestFlowLog(t *testing.T, dir string) *flowLog {
	t.Helper()
	store, err := flowstore.Open(dir, flowstore.Options{Window: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	l := newFlowLog(store)
	t.Cleanup(func() { l.close() })
	return l
}

func TestFlowLogKeepsTheNewestAndFollows(t *testing.T) {
	dir := t.TempDir()
	l := openTestFlowLog(t, dir)
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := 0; i < flowHistory+10; i++ {
		add(l, api.Flow{Time: t0.Add(time.Duration(i) * time.Millisecond), Src: "10.244.1.2:40000", PeerIdentity: uint32(i)})
	}
	// The same peer again, from another port: counted, not kept apart.
	add(l, api.Flow{Time: t0.Add(time.Hour), Src: "10.244.1.2:40001", PeerIdentity: flowHistory + 9})
	newest := func(context string) []api.Flow {
		t.Helper()
		got, err := l.recent()
		if err != nil {
			t.Fatalf("%s: %v", context, err)
		}
		last := got[len(got)-1]
		if len(got) != flowHistory || got[0].PeerIdentity != 10 || last.PeerIdentity != flowHistory+9 || last.Count != 2 || last.Src != "10.244.1.2" {
			t.Fatalf("%s: %d records from %d to %+v, want %d from 10 to %d counted twice", context, len(got), got[0].PeerIdentity, last, flowHistory, flowHistory+9)
		}
		return got
	}
	newest("recent")
	if err := l.close(); err != nil {
		t.Fatal(err)
	}
	// The records outlive the agent.
	l = openTestFlowLog(t, dir)
	newest("after a restart")

	held, ch, cancel, err := l.follow(api.FlowsQuery{})
	if err != nil || len(held) != flowHistory {
		t.Fatalf("follow held %d (%v)", len(held), err)
	}
	add(l, api.Flow{Src: "10.244.1.2:40002", PeerIdentity: 99999})
	select {
	case f := <-ch:
		// Followers get each flow as it happens, port and all.
		if f.PeerIdentity != 99999 || f.Src != "10.244.1.2:40002" || f.Count != 0 {
			t.Fatalf("followed %+v", f)
		}
	case <-time.After(time.Second):
		t.Fatal("no flow followed")
	}
	cancel()
	// A follower that never reads loses flows; the log does not block.
	_, _, cancel, err = l.follow(api.FlowsQuery{})
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	for i := 0; i < followerBuffer+5; i++ {
		add(l, api.Flow{})
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
		nodeOf: map[netip.Addr]string{b: "n2"},
		labels: map[policy.Identity][]string{300: {"k8s:app=backend"}},
		rules: map[policy.RuleID]policy.RuleRef{
			5: {Kind: policy.KindNetworkPolicy, Namespace: "demo", Name: "allow-web", Direction: policy.Egress, Index: 0},
			6: {Kind: policy.KindWeirClusterNetworkPolicy, Name: "guard", Direction: policy.Egress, Index: 2,
				Tier: policy.TierAdmin, Priority: 10, Action: policy.ActionReject, RuleName: "no-db"},
			7: {Kind: policy.KindClusterNetworkPolicy, Name: "audit", Direction: policy.Egress, Index: 0,
				Tier: policy.TierAdmin, Priority: 1, Action: policy.ActionLog},
		},
	}
	ev := datapath.VerdictEvent{Ifindex: 7, Direction: policy.Egress, Verdict: policy.VerdictAllow,
		Stage: policy.StageNetworkPolicy, Peer: 300, Rule: 5,
		Src: netip.AddrPortFrom(a, 40000), Dst: netip.AddrPortFrom(b, 80), Proto: 6}
	f := n.explain("n1", ev)
	if f.Pod != "demo/frontend" || f.Peer != "demo/backend" || f.Verdict != "allowed" || f.Proto != "TCP" ||
		f.Rule != "networkpolicy demo/allow-web egress[0]" || len(f.PeerLabels) != 1 {
		t.Fatalf("allowed flow explained as %+v", f)
	}
	if f.Decider == nil || f.Decider.Kind != policy.KindNetworkPolicy || f.Decider.Namespace != "demo" || f.Stage != "networkpolicy" {
		t.Fatalf("allowed flow names its rule as %+v (stage %q)", f.Decider, f.Stage)
	}
	ev.Verdict, ev.Stage, ev.Rule = policy.VerdictDeny, policy.StageNetworkPolicyDefaultDeny, 0
	if f = n.explain("n1", ev); f.Verdict != "denied" || !strings.Contains(f.Rule, "default deny") || f.Decider != nil {
		t.Fatalf("denied flow explained as %+v", f)
	}
	ev.Verdict, ev.Stage, ev.Rule, ev.Log = policy.VerdictReject, policy.StageAdmin, 6, 7
	f = n.explain("n1", ev)
	want := api.FlowRule{Kind: policy.KindWeirClusterNetworkPolicy, Name: "guard", Tier: "Admin", Priority: 10,
		Direction: "egress", Index: 2, RuleName: "no-db", Action: "Reject"}
	if f.Verdict != "rejected" || f.Stage != "admin" || f.Decider == nil || *f.Decider != want ||
		f.LoggedBy == nil || f.LoggedBy.Name != "audit" || f.LoggedBy.Action != "Log" {
		t.Fatalf("rejected flow explained as %+v, decider %+v, logged by %+v", f, f.Decider, f.LoggedBy)
	}
	ev.Verdict, ev.Stage, ev.Rule, ev.Log = policy.VerdictAllow, policy.StageUnenforced, 0, 0
	ev.Direction, ev.Ifindex = policy.Ingress, 8
	if f = n.explain("n1", ev); f.Pod != "ifindex 8" || f.Peer != a.String() || !strings.Contains(f.Rule, "no policy selects") {
		t.Fatalf("unknown endpoint explained as %+v", f)
	}
	// A flow from outside this node sent on to a backend on n2: no policy
	// judged it here; the record names the backend and its node.
	outside := netip.MustParseAddr("192.0.2.9")
	fwd := datapath.VerdictEvent{Direction: policy.Ingress, Verdict: policy.VerdictForwarded, Peer: 2,
		Src: netip.AddrPortFrom(outside, 40000), Dst: netip.AddrPortFrom(b, 80), Proto: 6,
		Service: netip.MustParseAddrPort("10.99.0.11:30080")}
	f = n.explain("n1", fwd)
	if f.Verdict != "forwarded" || f.Pod != "demo/backend" || f.Peer != outside.String() || f.Stage != "" ||
		f.Decider != nil || f.ServiceAddr != "10.99.0.11:30080" || !strings.Contains(f.Rule, "forwarded to node n2") {
		t.Fatalf("forwarded flow explained as %+v", f)
	}
}

// add records f and sends it to the followers, as an event and its record
// both reach them.
func add(l *flowLog, f api.Flow) {
	l.record(f)
	l.send(f)
}

// TestFlowsQuerySearchesTheWholeStore: a denied flow recorded before
// 10,000 allowed ones (more than a page, written to segments) is found by
// a server-side filter, and paging with --before walks the history in
// disjoint pages, newest first.
func TestFlowsQuerySearchesTheWholeStore(t *testing.T) {
	dir := t.TempDir()
	l := openTestFlowLog(t, dir)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	add(l, api.Flow{Time: t0, Verdict: "denied", Pod: "x/db", Src: "10.244.1.9:40000", Dst: "10.244.1.3:5432", PeerIdentity: 1})
	for i := 1; i <= 10000; i++ {
		add(l, api.Flow{Time: t0.Add(time.Duration(i) * time.Millisecond), Verdict: "allowed", Pod: "x/web",
			Src: "10.244.1.2:40000", Dst: "10.244.1.3:80", PeerIdentity: uint32(1000 + i)})
	}
	if err := l.close(); err != nil { // written to segments
		t.Fatal(err)
	}
	l = openTestFlowLog(t, dir)
	a := &Agent{flows: l}
	get := func(q api.FlowsQuery) []api.Flow {
		t.Helper()
		rec := httptest.NewRecorder()
		a.serveFlows(rec, httptest.NewRequest("GET", api.PathFlows+"?"+q.Values().Encode(), nil))
		if rec.Code != 200 {
			t.Fatalf("%v: %d %s", q.Values(), rec.Code, rec.Body)
		}
		var out []api.Flow
		for _, line := range strings.Split(strings.TrimSpace(rec.Body.String()), "\n") {
			if line == "" {
				continue
			}
			var f api.Flow
			if err := json.Unmarshal([]byte(line), &f); err != nil {
				t.Fatal(err)
			}
			out = append(out, f)
		}
		return out
	}
	if got := get(api.FlowsQuery{FlowFilter: api.FlowFilter{Verdict: "denied"}}); len(got) != 1 || got[0].Pod != "x/db" {
		t.Fatalf("denied flows: %+v, want the one recorded first", got)
	}
	if got := get(api.FlowsQuery{FlowFilter: api.FlowFilter{Pod: "db", Port: 5432}}); len(got) != 1 {
		t.Fatalf("flows of db on 5432: %d, want 1", len(got))
	}
	page1 := get(api.FlowsQuery{Limit: 100})
	page2 := get(api.FlowsQuery{Limit: 100, FlowFilter: api.FlowFilter{Before: api.LastSeen(page1[0])}})
	if len(page1) != 100 || len(page2) != 100 || page1[99].PeerIdentity != 11000 || page1[0].PeerIdentity != 10901 ||
		page2[99].PeerIdentity != 10900 || page2[0].PeerIdentity != 10801 {
		t.Fatalf("pages %d..%d and %d..%d, want 10901..11000 and 10801..10900",
			page1[0].PeerIdentity, page1[len(page1)-1].PeerIdentity, page2[0].PeerIdentity, page2[len(page2)-1].PeerIdentity)
	}
	rec := httptest.NewRecorder()
	a.serveFlows(rec, httptest.NewRequest("GET", api.PathFlows+"?verdict=dropped", nil))
	if rec.Code == 200 || !strings.Contains(rec.Body.String(), "verdict") {
		t.Fatalf("bad verdict: %d %s, want an error naming it", rec.Code, rec.Body)
	}
}

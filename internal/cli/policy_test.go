package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/weirnet/weir/internal/api"
)

func TestParseTraceArgs(t *testing.T) {
	cases := []struct {
		args    []string
		want    api.TraceQuery
		wantErr string
	}{
		{[]string{"frontend", "db", "5432/tcp"}, api.TraceQuery{Src: "demo/frontend", Dst: "demo/db", Proto: "tcp", Port: 5432}, ""},
		{[]string{"other/a", "10.96.0.10", "53/UDP"}, api.TraceQuery{Src: "other/a", Dst: "10.96.0.10", Proto: "udp", Port: 53}, ""},
		{[]string{"a", "b", "ICMP"}, api.TraceQuery{Src: "demo/a", Dst: "demo/b", Proto: "icmp"}, ""},
		{[]string{"a", "b", "80"}, api.TraceQuery{}, "want PORT/PROTO"},
		{[]string{"a", "b", "80/sctp"}, api.TraceQuery{}, "want PORT/PROTO"},
		{[]string{"a", "b", "0/tcp"}, api.TraceQuery{}, "from 1 to 65535"},
		{[]string{"a", "b", "70000/tcp"}, api.TraceQuery{}, "from 1 to 65535"},
		{[]string{"a", "b", "http/tcp"}, api.TraceQuery{}, "from 1 to 65535"},
		{[]string{"a/b/c", "b", "80/tcp"}, api.TraceQuery{}, "want a pod"},
	}
	for _, c := range cases {
		got, err := parseTraceArgs(c.args, "demo")
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%v: error %v, want one containing %q", c.args, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%v: %+v, %v; want %+v", c.args, got, err, c.want)
		}
	}
}

type fakeTracer struct {
	t   *api.Trace
	err error
}

func (f fakeTracer) Trace(context.Context, api.TraceQuery) (*api.Trace, error) { return f.t, f.err }

// deniedTrace: frontend's egress denied by an Admin rule on node n1.
func deniedTrace() *api.Trace {
	return &api.Trace{
		Node: "n1", Proto: "tcp", Port: 5432,
		Src: api.TracePeer{Pod: "demo/frontend", IP: "10.244.1.2", Node: "n1", Local: true},
		Dst: api.TracePeer{Pod: "demo/db", IP: "10.244.2.3", Node: "n2"},
		Ends: []api.TraceEnd{{
			Pod: "demo/frontend", Direction: "egress", Tiered: true, Policies: []string{"ClusterNetworkPolicy/deny-db"},
			PeerIdentity: "70001", PeerCIDRIdentity: "world",
			Steps: []string{"1. Admin tier: denied by clusternetworkpolicy deny-db (Admin tier, priority 10) egress[0] Deny"},
			Compiled: api.TraceDecision{Verdict: "denied", Stage: "admin", Rule: 7,
				RuleName: "clusternetworkpolicy deny-db (Admin tier, priority 10) egress[0] Deny",
				Log:      9, LogName: "clusternetworkpolicy audit (Admin tier, priority 1) egress[0] Log"},
			Datapath: &api.TraceDecision{Verdict: "denied", Stage: "admin", Rule: 7, Log: 9,
				RuleName: "clusternetworkpolicy deny-db (Admin tier, priority 10) egress[0] Deny",
				LogName:  "clusternetworkpolicy audit (Admin tier, priority 1) egress[0] Log"},
			Agree: true,
		}},
		Program: "from_container", TCVerdict: "shot", Verdict: "denied", Agree: true,
	}
}

func TestRunTraceText(t *testing.T) {
	var out bytes.Buffer
	notLocal := &api.Error{Code: api.CodeTraceNotLocal, Msg: "trace", Details: "no end of the flow is on this node"}
	clients := map[string]traceClient{"n1": fakeTracer{t: deniedTrace()}, "n3": fakeTracer{err: notLocal}}
	if err := runTrace(context.Background(), api.TraceQuery{}, "wide", clients, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"demo/frontend (10.244.1.2) -> demo/db (10.244.2.3) on n2 5432/TCP, on node n1:",
		"egress of demo/frontend: DENIED at admin by clusternetworkpolicy deny-db (Admin tier, priority 10) egress[0] Deny; logged by clusternetworkpolicy audit",
		"  1. Admin tier: denied by clusternetworkpolicy deny-db",
		"  selected by: ClusterNetworkPolicy/deny-db",
		"  peer identity: 70001, peer CIDR identity: world",
		"datapath (BPF_PROG_RUN): denied by rule 7, logged by rule 9 - agrees",
		"flow denied; from_container returned shot - compiled policy and datapath agree",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRunTraceFailsLoudlyOnDisagreement(t *testing.T) {
	tr := deniedTrace()
	tr.Ends[0].Datapath.Rule, tr.Ends[0].Agree, tr.Agree = 8, false, false
	var out bytes.Buffer
	err := runTrace(context.Background(), api.TraceQuery{}, "", map[string]traceClient{"": fakeTracer{t: tr}}, &out)
	if !errors.Is(err, ErrTraceDisagrees) {
		t.Fatalf("error %v, want ErrTraceDisagrees", err)
	}
	for _, want := range []string{"- DISAGREES", "!!! COMPILED POLICY AND DATAPATH DISAGREE"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRunTraceJSONAndErrors(t *testing.T) {
	var out bytes.Buffer
	if err := runTrace(context.Background(), api.TraceQuery{}, "json", map[string]traceClient{"": fakeTracer{t: deniedTrace()}}, &out); err != nil {
		t.Fatal(err)
	}
	var got []api.Trace
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || len(got) != 1 || got[0].Ends[0].Compiled.Rule != 7 {
		t.Fatalf("json output %s: %v", out.String(), err)
	}
	// One agent and the flow is not its: its error, naming the nodes, is the answer.
	notLocal := &api.Error{Code: api.CodeTraceNotLocal, Msg: "trace", Details: "source demo/a is on node n2"}
	err := runTrace(context.Background(), api.TraceQuery{}, "", map[string]traceClient{"": fakeTracer{err: notLocal}}, &out)
	if err == nil || !strings.Contains(err.Error(), "node n2") {
		t.Fatalf("error %v, want the agent's, naming node n2", err)
	}
	// A lab where no node holds an end.
	err = runTrace(context.Background(), api.TraceQuery{}, "", map[string]traceClient{"n1": fakeTracer{err: notLocal}, "n2": fakeTracer{err: notLocal}}, &out)
	if err == nil || !strings.Contains(err.Error(), "no node holds an end") {
		t.Fatalf("error %v, want no node holds an end", err)
	}
	if err := validateOutput("table"); err == nil {
		t.Fatal("output table accepted")
	}
}

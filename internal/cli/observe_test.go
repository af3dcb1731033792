package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/weirnet/weir/internal/api"
)

func observeFlows() []api.Flow {
	now := time.Now()
	return []api.Flow{
		{Time: now.Add(-time.Hour), Verdict: "allowed", Pod: "demo/web", Peer: "demo/db", Dst: "10.0.0.2:5432",
			PeerLabels: []string{"k8s:app=db", "ns:team=a"}, Decider: &api.FlowRule{Kind: "NetworkPolicy", Namespace: "demo", Name: "allow-db"}},
		{Time: now.Add(-time.Minute), Verdict: "rejected", Pod: "demo/web", Peer: "demo/cache", Dst: "10.0.0.3:6379",
			PeerLabels: []string{"k8s:app=cache"}, Decider: &api.FlowRule{Kind: "WeirClusterNetworkPolicy", Name: "guard", Action: "Reject"},
			LoggedBy: &api.FlowRule{Kind: "ClusterNetworkPolicy", Name: "audit", Action: "Log"}},
		{Time: now.Add(-2 * time.Hour), LastTime: now.Add(-10 * time.Second), Count: 7, Verdict: "denied", Pod: "other/x", Peer: "10.1.1.1", Dst: "10.1.1.1:53"},
		{Time: now.Add(-30 * time.Second), Verdict: "denied", Stage: "http", Pod: "demo/deathstar", Peer: "demo/web", Dst: "10.0.0.9:80", Proto: "TCP",
			Rule: "no HTTP rule allows it: weirnetworkpolicy demo/deathstar ingress[0]",
			HTTP: &api.FlowHTTP{Method: "PUT", Host: "deathstar.demo", Target: "/v1/exhaust-port", Status: 403, Closed: true}},
	}
}

func TestObserveFilters(t *testing.T) {
	tests := []struct {
		name string
		f    observeFlags
		want []int // indexes into observeFlows()
	}{
		{"no filter", observeFlags{}, []int{0, 1, 2, 3}},
		{"verdict rejected", observeFlags{verdict: "rejected"}, []int{1}},
		{"requests only", observeFlags{http: true}, []int{3}},
		{"requests by method", observeFlags{method: "PUT"}, []int{3}},
		{"requests by another method", observeFlags{method: "GET"}, nil},
		{"requests under a path", observeFlags{path: "/v1"}, []int{3}},
		{"requests by status", observeFlags{status: 403}, []int{3}},
		{"port", observeFlags{port: 5432}, []int{0}},
		{"policy by name (decider)", observeFlags{policy: "guard"}, []int{1}},
		{"policy by kind/name (log rule)", observeFlags{policy: "clusternetworkpolicy/audit"}, []int{1}},
		{"policy by namespace/name", observeFlags{policy: "demo/allow-db"}, []int{0}},
		{"since: an aggregate counts by its last flow", observeFlags{since: 5 * time.Minute}, []int{1, 2, 3}},
		{"label selector on the peer", observeFlags{selector: "app in (db,cache)"}, []int{0, 1}},
		{"namespace", observeFlags{namespace: "other"}, []int{2}},
		{"namespace of a request's pods", observeFlags{namespace: "demo", http: true}, []int{3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := tt.f
			f.limit = api.DefaultFlowLimit
			if err := f.validate(); err != nil {
				t.Fatal(err)
			}
			var got []int
			for i, fl := range observeFlows() {
				if f.query.Matcher()(fl) {
					got = append(got, i)
				}
			}
			if len(got) != len(tt.want) {
				t.Fatalf("matched %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("matched %v, want %v", got, tt.want)
				}
			}
		})
	}
}

func TestObserveRejectsBadFlags(t *testing.T) {
	for _, f := range []observeFlags{{output: "xml"}, {verdict: "dropped"}, {port: 70000}, {since: -time.Second}, {selector: "app in ("},
		{limit: -1}, {limit: api.MaxFlowLimit + 1}, {before: "yesterday"}, {status: 999}, {path: "v1/x"}} {
		if f.limit == 0 {
			f.limit = api.DefaultFlowLimit
		}
		if err := runObserve(context.Background(), &f, nil, &bytes.Buffer{}); err == nil {
			t.Errorf("%+v: no error", f)
		}
	}
}

func TestObserveTableShowsCounts(t *testing.T) {
	var b bytes.Buffer
	printFlowHeader(&b, "")
	printFlow(&b, &b, observeFlows()[2], "")
	if !strings.Contains(b.String(), "COUNT") || !strings.Contains(b.String(), "\t7\t") {
		t.Fatalf("table without the aggregate's count:\n%s", b.String())
	}
}

func TestObserveHTTPTableShowsRequests(t *testing.T) {
	var b bytes.Buffer
	f := observeFlags{http: true}
	printFlowHeader(&b, f.tableFormat())
	printFlow(&b, &b, observeFlows()[3], f.tableFormat())
	for _, want := range []string{"STATUS", "REQUEST", "\t403\t", "PUT deathstar.demo /v1/exhaust-port", "no HTTP rule allows it"} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("requests table lacks %q:\n%s", want, b.String())
		}
	}
	// In the connections' table a request shows after its destination.
	b.Reset()
	printFlow(&b, &b, observeFlows()[3], "")
	if !strings.Contains(b.String(), "10.0.0.9:80/TCP PUT deathstar.demo /v1/exhaust-port") {
		t.Fatalf("table row without the request: %s", b.String())
	}
}

func TestObserveHTTPTableShowsAnswers(t *testing.T) {
	var b bytes.Buffer
	f := observeFlags{http: true}
	printFlowHeader(&b, f.tableFormat())
	fl := observeFlows()[3]
	fl.Verdict, fl.Count = "allowed", 12
	fl.HTTP = &api.FlowHTTP{Method: "GET", Host: "deathstar.demo", Target: "/v1/status", Status: 503, Reply: true,
		Latency: 1234567 * time.Nanosecond, LatencyMax: 20 * time.Millisecond}
	printFlow(&b, &b, fl, f.tableFormat())
	for _, want := range []string{"LATENCY", "\t503\t", "1.23ms (max 20ms)", "answer to GET deathstar.demo /v1/status"} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("requests table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestStatusPrintsPolicy(t *testing.T) {
	var b bytes.Buffer
	printStatus(&api.Status{Node: "n1", Policy: &api.PolicyStatus{
		Loaded: time.Unix(0, 0), Error: "write key: no space", Endpoints: 3, Rules: 7, Entries: 40,
		CompileErrors:   []string{"WeirClusterNetworkPolicy/x: ingress[0]: bad"},
		ClusterPolicies: map[string]int64{"ClusterNetworkPolicy/guard": 4, "WeirNetworkPolicy/empire/deathstar": 2},
		Warnings:        []string{"WeirClusterNetworkPolicy/out: egress rules with HTTP rules are not judged"},
		Maps:            map[string]api.MapFill{"conntrack": {Entries: 900, Capacity: 1000}},
	}}, &b)
	for _, want := range []string{"last load FAILED", "3 endpoints, 7 rules, 40 map entries", "policy error WeirClusterNetworkPolicy/x",
		"policy warning WeirClusterNetworkPolicy/out: egress rules with HTTP rules are not judged",
		"cluster policy ClusterNetworkPolicy/guard generation 4 programmed", "  policy WeirNetworkPolicy/empire/deathstar generation 2 programmed", "map conntrack        900/1000 (90.0%)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
}

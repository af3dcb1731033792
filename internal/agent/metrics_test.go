package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/tools/record"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/policy"
)

var errLoadFailed = errors.New("load failed")

// metricsDatapath is a datapath with counters and maps and nothing else.
type metricsDatapath struct {
	Datapath
	counters map[string]uint64
	entries  map[string]int
	capacity int
	counted  []string // MapEntries calls
	verdicts []datapath.VerdictCount
}

func (d *metricsDatapath) VerdictCounts() ([]datapath.VerdictCount, error) { return d.verdicts, nil }

func (d *metricsDatapath) Metrics() (map[string]uint64, error) { return d.counters, nil }
func (d *metricsDatapath) MapCapacity(string) (int, error)     { return d.capacity, nil }
func (d *metricsDatapath) MapEntries(name string, _ int) (int, error) {
	d.counted = append(d.counted, name)
	return d.entries[name], nil
}

func newTestMetrics(t *testing.T, dp *metricsDatapath) (*metrics, *bytes.Buffer) {
	t.Helper()
	var logs bytes.Buffer
	return newMetrics(dp, openTestFlowLog(t, t.TempDir()), slog.New(slog.NewTextHandler(&logs, nil))), &logs
}

func TestFillAlarm(t *testing.T) {
	steps := []struct {
		ratio float64
		want  fillChange
	}{
		{0.1, fillSame},
		{0.79, fillSame},
		{0.8, fillRaised},
		{0.95, fillSame}, // still high: warned already
		{0.75, fillSame}, // between the two: no flapping
		{0.85, fillSame},
		{0.69, fillCleared},
		{0.72, fillSame},
		{1.0, fillRaised}, // a new crossing
		{0, fillCleared},
	}
	a := fillAlarm{warnAt: 0.8, clearAt: 0.7}
	for i, s := range steps {
		if got := a.observe("conntrack", s.ratio); got != s.want {
			t.Fatalf("step %d (%.2f): %v, want %v", i, s.ratio, got, s.want)
		}
		// Other maps have their own state.
		if got := a.observe("ipcache", 0.5); got != fillSame {
			t.Fatalf("step %d: ipcache changed: %v", i, got)
		}
	}
}

// verdictNames names rules 11 (an Admin Deny, block-db), 12 (a Log rule,
// audit) and 13 (a NetworkPolicy allow) and the pods on ifindex 5 and 6.
func verdictNames() *flowNames {
	return &flowNames{pods: map[int]string{5: "shop/web", 6: "shop/db"}, rules: map[policy.RuleID]policy.RuleRef{
		11: {Kind: policy.KindWeirClusterNetworkPolicy, Name: "block-db", Direction: policy.Egress, Tier: policy.TierAdmin, Action: policy.ActionDeny},
		12: {Kind: policy.KindWeirClusterNetworkPolicy, Name: "audit", Direction: policy.Ingress, Tier: policy.TierAdmin, Action: policy.ActionLog},
		13: {Kind: policy.KindNetworkPolicy, Namespace: "shop", Name: "allow-web", Direction: policy.Ingress},
	}}
}

// TestVerdictMetricsFromCounters: the verdict, drop and Log metrics are
// the datapath's verdict counters, named as flows are: by verdict,
// direction and stage; drops by the deciding policy (a default deny by
// the pod's namespace; a rule no longer loaded with empty names); Log
// matches by their policy. Counters that name the same series add up.
func TestVerdictMetricsFromCounters(t *testing.T) {
	dp := &metricsDatapath{verdicts: []datapath.VerdictCount{
		{Rule: 13, Verdict: policy.VerdictAllow, Direction: policy.Ingress, Stage: policy.StageNetworkPolicy, Count: 1},
		{Rule: 13, Log: 12, Verdict: policy.VerdictAllow, Direction: policy.Ingress, Stage: policy.StageNetworkPolicy, Count: 1},
		{Ifindex: 6, Verdict: policy.VerdictDeny, Direction: policy.Ingress, Stage: policy.StageNetworkPolicyDefaultDeny, Count: 2},
		{Rule: 11, Verdict: policy.VerdictDeny, Direction: policy.Egress, Stage: policy.StageAdmin, Count: 1},
		{Rule: 99, Verdict: policy.VerdictReject, Direction: policy.Egress, Stage: policy.StageBaseline, Count: 1}, // unloaded meanwhile
	}}
	m, _ := newTestMetrics(t, dp)
	m.verdicts.names = verdictNames
	want := `
# HELP weir_policy_drops_total Denied and rejected verdicts by the policy that decided; NetworkPolicy default deny has action DefaultDeny and no policy.
# TYPE weir_policy_drops_total counter
weir_policy_drops_total{action="DefaultDeny",kind="NetworkPolicy",namespace="shop",policy=""} 2
weir_policy_drops_total{action="Deny",kind="WeirClusterNetworkPolicy",namespace="",policy="block-db"} 1
weir_policy_drops_total{action="Reject",kind="",namespace="",policy=""} 1
# HELP weir_policy_logged_total Verdicts a Log rule saw, by its policy.
# TYPE weir_policy_logged_total counter
weir_policy_logged_total{kind="WeirClusterNetworkPolicy",policy="audit"} 1
# HELP weir_policy_verdicts_total Policy verdicts of the datapath: drops and the first packet of each allowed connection.
# TYPE weir_policy_verdicts_total counter
weir_policy_verdicts_total{direction="egress",stage="admin",verdict="denied"} 1
weir_policy_verdicts_total{direction="egress",stage="baseline",verdict="rejected"} 1
weir_policy_verdicts_total{direction="ingress",stage="networkpolicy",verdict="allowed"} 2
weir_policy_verdicts_total{direction="ingress",stage="networkpolicy-default-deny",verdict="denied"} 2
`
	if err := testutil.GatherAndCompare(m.reg, strings.NewReader(want), metricDrops, metricLogged, metricVerdicts); err != nil {
		t.Fatal(err)
	}
}

func TestMapFillCountsAndWarns(t *testing.T) {
	dp := &metricsDatapath{capacity: 100, entries: map[string]int{datapath.MapConntrack: 85, datapath.MapPolicy: 3}}
	m, logs := newTestMetrics(t, dp)
	rec := record.NewFakeRecorder(10)
	m.maps.onRaised(mapFullEvent(rec, "n1"))

	// Before a policy load the policy map is counted; after one the
	// agent's own count stands in.
	m.maps.current(0)
	if !slices.Contains(dp.counted, datapath.MapPolicy) {
		t.Fatalf("counted %v: the policy map must be counted while its content is unknown", dp.counted)
	}
	res := &policy.Result{Endpoints: map[string]*policy.EndpointPolicy{
		"shop/web": {Entries: map[policy.Key]policy.Entry{{Peer: 1}: {}, {Peer: 2}: {}}},
		"shop/db":  {Entries: map[policy.Key]policy.Entry{{Peer: 3}: {}}},
		"gone/pod": {Entries: map[policy.Key]policy.Entry{{Peer: 4}: {}}}, // no veth: not written
	}}
	m.reconciled(3*time.Millisecond, res, map[string]datapath.PolicyEndpoint{"shop/web": {Ifindex: 5}, "shop/db": {Ifindex: 6}, "gone/pod": {}}, nil)
	dp.counted = nil
	usage := m.maps.current(0)
	if slices.Contains(dp.counted, datapath.MapPolicy) || usage[datapath.MapPolicy].entries != 3 {
		t.Fatalf("policy map %+v (counted %v): want the 3 entries the agent wrote, uncounted", usage[datapath.MapPolicy], dp.counted)
	}
	if got := strings.Count(logs.String(), "BPF map nearly full"); got != 1 || !strings.Contains(logs.String(), "map=conntrack") {
		t.Fatalf("%d warnings, want one for conntrack:\n%s", got, logs)
	}
	select {
	case e := <-rec.Events:
		if !strings.HasPrefix(e, "Warning BPFMapNearlyFull datapath map conntrack holds 85 of 100") {
			t.Fatalf("event %q, want a BPFMapNearlyFull warning for conntrack", e)
		}
	default:
		t.Fatal("no event for the map past the threshold")
	}
	if len(rec.Events) != 0 {
		t.Fatalf("%d more events, want one", len(rec.Events))
	}
	// Counted again within the interval: the cached counts, no warning.
	dp.counted = nil
	m.maps.current(time.Hour)
	if len(dp.counted) != 0 || strings.Count(logs.String(), "BPF map nearly full") != 1 {
		t.Fatalf("counted %v again within the interval", dp.counted)
	}
	// A failed load leaves the map's content unknown: counted again.
	m.reconciled(time.Millisecond, res, nil, errLoadFailed)
	m.maps.current(0)
	if !slices.Contains(dp.counted, datapath.MapPolicy) {
		t.Fatalf("counted %v after a failed load, want the policy map", dp.counted)
	}
	if got := testutil.ToFloat64(m.reconcileErrors); got != 1 {
		t.Fatalf("reconcile errors %v, want 1", got)
	}
}

// TestIdentitySpaceFillWarns: the cluster's identity space is reported
// beside the maps, and past 80 % a Warning event on the Node says what a
// full space does (new label sets are unidentified, denied).
func TestIdentitySpaceFillWarns(t *testing.T) {
	dp := &metricsDatapath{capacity: 100, entries: map[string]int{}}
	m, _ := newTestMetrics(t, dp)
	rec := record.NewFakeRecorder(10)
	m.maps.onRaised(mapFullEvent(rec, "n1"))
	if _, ok := m.maps.current(0)[fillIdentities]; ok {
		t.Fatal("identity space reported before any snapshot")
	}
	m.maps.identities.Store(1000)
	if u := m.maps.current(0)[fillIdentities]; u.entries != 1000 || u.capacity != 65280 || len(rec.Events) != 0 {
		t.Fatalf("identity space %+v, %d events; want 1000 of 65280 and no warning", u, len(rec.Events))
	}
	m.maps.identities.Store(60000)
	m.maps.current(0)
	select {
	case e := <-rec.Events:
		if !strings.HasPrefix(e, "Warning IdentitySpaceNearlyFull 60000 of 65280 security identities") {
			t.Fatalf("event %q, want an IdentitySpaceNearlyFull warning", e)
		}
	default:
		t.Fatal("no event for an identity space past the threshold")
	}
}

// gatherAll fills every metric of a registry with one sample and gathers
// them, by name.
func gatherAll(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	counters := map[string]uint64{}
	for i, name := range datapath.MetricNames {
		counters[name] = uint64(i + 1)
	}
	dp := &metricsDatapath{counters: counters, capacity: 1000, entries: map[string]int{datapath.MapConntrack: 10}}
	m, _ := newTestMetrics(t, dp)
	dp.verdicts = []datapath.VerdictCount{{Rule: 11, Log: 12, Verdict: policy.VerdictDeny, Direction: policy.Egress, Stage: policy.StageAdmin, Count: 1}}
	m.verdicts.names = verdictNames
	m.reconciled(2*time.Millisecond, &policy.Result{}, nil, nil)
	m.reconciled(time.Millisecond, nil, nil, errLoadFailed)
	// A request's record and one of its answers: their counters have
	// series only once counted.
	m.countHTTP(api.Flow{Verdict: "allowed", HTTP: &api.FlowHTTP{Method: "GET"}})
	m.countHTTP(api.Flow{Verdict: "allowed", HTTP: &api.FlowHTTP{Method: "GET", Reply: true, Status: 200, Latency: time.Millisecond}})
	families, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range families {
		out[f.GetName()] = f
	}
	return out
}

func labelNames(f *dto.MetricFamily) []string {
	var out []string
	for _, l := range f.GetMetric()[0].GetLabel() {
		out = append(out, l.GetName())
	}
	slices.Sort(out)
	return out
}

func TestMetricsRegistry(t *testing.T) {
	families := gatherAll(t)
	want := map[string]struct {
		typ    dto.MetricType
		labels []string
	}{
		metricPackets:         {dto.MetricType_COUNTER, []string{"outcome"}},
		metricEventsLost:      {dto.MetricType_COUNTER, nil},
		metricVerdicts:        {dto.MetricType_COUNTER, []string{"direction", "stage", "verdict"}},
		metricDrops:           {dto.MetricType_COUNTER, []string{"action", "kind", "namespace", "policy"}},
		metricLogged:          {dto.MetricType_COUNTER, []string{"kind", "policy"}},
		metricReconcile:       {dto.MetricType_HISTOGRAM, nil},
		metricReconcileErrors: {dto.MetricType_COUNTER, nil},
		metricMapEntries:      {dto.MetricType_GAUGE, []string{"map"}},
		metricMapCapacity:     {dto.MetricType_GAUGE, []string{"map"}},
		metricMapFill:         {dto.MetricType_GAUGE, []string{"map"}},
		metricFlowBytes:       {dto.MetricType_GAUGE, nil},
		metricFlowSegments:    {dto.MetricType_GAUGE, nil},
		metricFlowWritten:     {dto.MetricType_COUNTER, nil},
		metricFlowDropped:     {dto.MetricType_COUNTER, nil},
		metricFlowWriteErrors: {dto.MetricType_COUNTER, nil},
	}
	for name, w := range want {
		f, ok := families[name]
		if !ok {
			t.Errorf("%s not registered", name)
			continue
		}
		if f.GetType() != w.typ || !slices.Equal(labelNames(f), w.labels) {
			t.Errorf("%s: %v with labels %v, want %v with %v", name, f.GetType(), labelNames(f), w.typ, w.labels)
		}
	}
	// Every datapath counter but event_lost is an outcome.
	if n := len(families[metricPackets].GetMetric()); n != len(datapath.MetricNames)-1 {
		t.Errorf("%d outcomes, want %d", n, len(datapath.MetricNames)-1)
	}
	for _, mt := range families[metricMapFill].GetMetric() {
		if mt.GetLabel()[0].GetValue() == datapath.MapConntrack && mt.GetGauge().GetValue() != 0.01 {
			t.Errorf("conntrack fill %v, want 0.01", mt.GetGauge().GetValue())
		}
	}
}

func TestMetricsHandlerServesText(t *testing.T) {
	a := &Agent{metrics: newMetrics(&metricsDatapath{counters: map[string]uint64{"drop_policy": 7, "event_lost": 2}}, openTestFlowLog(t, t.TempDir()), slog.Default())}
	rec := httptest.NewRecorder()
	a.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", PathMetrics, nil))
	body := rec.Body.String()
	for _, line := range []string{`weir_datapath_packets_total{outcome="drop_policy"} 7`, "weir_verdict_events_lost_total 2", "weir_flowstore_bytes 0"} {
		if !strings.Contains(body, line+"\n") {
			t.Errorf("no %q in:\n%s", line, body)
		}
	}
	rec = httptest.NewRecorder()
	a.Handler().ServeHTTP(rec, httptest.NewRequest("GET", PathMetrics, nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), metricPackets) {
		t.Errorf("the socket's %s: %d\n%s", PathMetrics, rec.Code, rec.Body)
	}
	// The API client reads the same text from the socket's handler.
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	c := api.NewDialClient(srv.URL, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Listener.Addr().String())
	})
	text, err := c.Metrics(context.Background())
	if err != nil || !strings.Contains(text, `weir_datapath_packets_total{outcome="drop_policy"} 7`+"\n") {
		t.Errorf("Client.Metrics: %v\n%s", err, text)
	}
	rec = httptest.NewRecorder()
	a.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", api.PathStatus, nil))
	if rec.Code != 404 {
		t.Errorf("the metrics listener answered %s with %d: it must serve metrics alone", api.PathStatus, rec.Code)
	}
}

// grafanaPanel is what the dashboard test reads of a panel.
type grafanaPanel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a collapsed row's
}

// TestDashboardMatchesMetrics keeps docs/grafana-dashboard.json from
// drifting: every weir_ metric a panel or variable queries is one the
// agent registers.
func TestDashboardMatchesMetrics(t *testing.T) {
	b, err := os.ReadFile("../../docs/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		SchemaVersion int            `json:"schemaVersion"`
		Panels        []grafanaPanel `json:"panels"`
		Templating    struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	if dash.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d: want a current Grafana dashboard", dash.SchemaVersion)
	}
	exprs := map[string]string{} // expression -> where
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q queries nothing", p.Title)
			}
			for _, tg := range p.Targets {
				exprs[tg.Expr] = "panel " + p.Title
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	hasDatasource := false
	for _, v := range dash.Templating.List {
		hasDatasource = hasDatasource || v.Type == "datasource"
		exprs[string(v.Query)] = "variable " + v.Name
	}
	if !hasDatasource || !strings.Contains(string(b), `"${datasource}"`) {
		t.Error("the dashboard must pick its Prometheus through a datasource variable")
	}

	families := gatherAll(t)
	name := regexp.MustCompile(`\bweir_[a-z0-9_]+`)
	used := map[string]bool{}
	for expr, where := range exprs {
		for _, n := range name.FindAllString(expr, -1) {
			base := n
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if f, ok := families[strings.TrimSuffix(n, suffix)]; ok && f.GetType() == dto.MetricType_HISTOGRAM {
					base = strings.TrimSuffix(n, suffix)
				}
			}
			if _, ok := families[base]; !ok {
				t.Errorf("%s queries %s, which the agent does not register", where, n)
			}
			used[base] = true
		}
	}
	for _, want := range []string{metricPackets, metricDrops, metricVerdicts, metricMapFill, metricReconcile, metricFlowBytes} {
		if !used[want] {
			t.Errorf("no panel shows %s", want)
		}
	}
}

// TestMetricsAreDocumented: every metric the agent registers, every
// datapath outcome and every map whose fill it reports is named in
// docs/metrics.md, the contract dashboards and alerts are written
// against. The names are read from the registry and the datapath's lists,
// not from this package's constants, so a renamed or added metric fails
// here until the page says so.
func TestMetricsAreDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := func(name string) bool { return strings.Contains(string(doc), "`"+name+"`") }
	for name := range gatherAll(t) {
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue
		}
		if !documented(name) {
			t.Errorf("metric %s is registered but not in docs/metrics.md", name)
		}
	}
	for _, name := range datapath.MetricNames {
		if !documented(name) {
			t.Errorf("datapath outcome %s is not in docs/metrics.md", name)
		}
	}
	for _, name := range append(slices.Clone(datapath.FillMaps), fillIdentities) {
		if !documented(name) {
			t.Errorf("map %s (weir_map_fill_ratio) is not in docs/metrics.md", name)
		}
	}
}

package agent

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/policy"
	"github.com/weirnet/weir/internal/proxy"
)

// PathMetrics is where the agent serves its Prometheus metrics: on the
// local API's socket and on Config.MetricsAddr.
const PathMetrics = api.PathMetrics

// The agent's metrics. Every name starts with weir_; labels are bounded
// by what the cluster defines (policies, map names), never by pods or
// addresses.
const (
	// weir_datapath_packets_total{outcome}: the datapath's own per-CPU
	// counters (bpf/lib/metrics.h), summed when scraped. outcome is a
	// datapath.MetricNames entry: redirect_local, drop_policy, drop_spoof,
	// drop_malformed, drop_tunnel, policy_reject, ct_new, ct_full, ... The
	// sock_lb ones count connect and sendmsg calls, not packets.
	metricPackets = "weir_datapath_packets_total"
	// weir_verdict_events_lost_total: verdict events the datapath could
	// not queue (the event_lost counter): flows and the verdict metrics
	// below miss them, the packets counters do not.
	metricEventsLost = "weir_verdict_events_lost_total"

	// weir_policy_verdicts_total{verdict, direction, stage}: verdict
	// events, a drop or the first packet of an allowed connection.
	metricVerdicts = "weir_policy_verdicts_total"
	// weir_policy_drops_total{kind, namespace, policy, action}: denied
	// and rejected events by the policy that decided. A NetworkPolicy
	// default deny has kind NetworkPolicy, the pod's namespace, no policy
	// and action DefaultDeny.
	metricDrops = "weir_policy_drops_total"
	// weir_policy_logged_total{kind, policy}: events a Log rule saw.
	metricLogged = "weir_policy_logged_total"

	// weir_policy_reconcile_seconds: one policy compile and load.
	metricReconcile = "weir_policy_reconcile_seconds"
	// weir_policy_reconcile_errors_total: loads that failed.
	metricReconcileErrors = "weir_policy_reconcile_errors_total"

	// weir_map_entries{map}, weir_map_capacity{map}, weir_map_fill_ratio{map}:
	// how full the maps in datapath.FillMaps are, counted at most every
	// mapCountEvery.
	metricMapEntries  = "weir_map_entries"
	metricMapCapacity = "weir_map_capacity"
	metricMapFill     = "weir_map_fill_ratio"

	metricHTTPRequests = "weir_http_requests_total"
	// Servers' answers to allowed requests, and their latencies summed.
	metricHTTPReplies      = "weir_http_replies_total"
	metricHTTPReplySeconds = "weir_http_reply_seconds_total"
	metricL7               = "weir_l7_total"
	// weir_l7_proxy_ended_total{reason}: handed connections the node's
	// proxy ended for a limit (internal/proxy.Limits); weir_l7_proxy_busy_slots:
	// its slots serving a connection.
	metricProxyEnded = "weir_l7_proxy_ended_total"
	metricProxyBusy  = "weir_l7_proxy_busy_slots"

	metricFlowBytes         = "weir_flowstore_bytes"
	metricFlowSegments      = "weir_flowstore_segments"
	metricFlowWritten       = "weir_flowstore_records_written_total"
	metricFlowDropped       = "weir_flowstore_dropped_segments_total"
	metricFlowWriteErrors   = "weir_flowstore_write_errors_total"
	metricFlowFollowMissed  = "weir_flow_follower_missed_total"
	datapathEventLostMetric = "event_lost" // in datapath.MetricNames
)

// Map fill: counted every mapCountEvery; a warning is logged when a map
// passes fillWarnAt and again only after it fell below fillClearAt.
const (
	mapCountEvery = 10 * time.Second
	fillWarnAt    = 0.8
	fillClearAt   = 0.7
)

// metrics is the agent's registry and the instruments its code updates;
// the rest is read when scraped.
type metrics struct {
	reg             *prometheus.Registry
	verdicts        *verdictCollector
	reconcile       prometheus.Histogram
	reconcileErrors prometheus.Counter
	maps            *mapFill
	httpRequests    *prometheus.CounterVec
	// httpReplies and httpReplySeconds count servers' answers to
	// allowed requests and sum their latencies.
	httpReplies, httpReplySeconds *prometheus.CounterVec
	// proxy is the node's L7 proxy once it runs.
	proxy atomic.Pointer[proxy.Proxy]
}

func newMetrics(dp Datapath, flows *flowLog, log *slog.Logger) *metrics {
	m := &metrics{
		reg:      prometheus.NewRegistry(),
		verdicts: &verdictCollector{},
		reconcile: prometheus.NewHistogram(prometheus.HistogramOpts{Name: metricReconcile,
			Help:    "Time of one policy compile and load into the datapath.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15)}), // 1 ms to 16 s
		reconcileErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: metricReconcileErrors,
			Help: "Policy loads that failed; the endpoints concerned fail closed."}),
		maps: newMapFill(dp, log),
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricHTTPRequests,
			Help: "Requests L7 policy judged, from their records, by verdict, the answer Weir wrote in the server's place (403, 400; empty when the request went on) and the policy that allowed or restricted them."},
			[]string{"verdict", "status", "kind", "namespace", "policy"}),
		httpReplies: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricHTTPReplies,
			Help: "Servers' answers to requests L7 policy allowed, read in the kernel, by status and the policy that allowed the requests."},
			[]string{"status", "kind", "namespace", "policy"}),
		httpReplySeconds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricHTTPReplySeconds,
			Help: "The time from each allowed request going on to the first byte of its answer, summed; over weir_http_replies_total, the mean latency."},
			[]string{"status", "kind", "namespace", "policy"}),
	}
	m.verdicts.src, _ = dp.(verdictCounter)
	l7src, _ := dp.(l7Counter)
	m.reg.MustRegister(m.verdicts, m.reconcile, m.reconcileErrors, m.httpRequests, m.httpReplies, m.httpReplySeconds, l7Collector{l7src}, proxyCollector{&m.proxy},
		datapathCollector{dp}, flowStoreCollector{flows}, m.maps,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// MetricsHandler serves the metrics alone: what the agent serves on
// cfg.MetricsAddr, which Prometheus scrapes from off the node.
func (a *Agent) MetricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET "+PathMetrics, a.metrics.handler())
	return mux
}

// handler serves the registry in the Prometheus text formats.
func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// verdictCounter is what the verdict metrics need from the datapath;
// *datapath.Node has it, a datapath without it has no verdict metrics.
type verdictCounter interface {
	VerdictCounts() ([]datapath.VerdictCount, error)
}

// verdictCollector serves the verdict, drop and Log metrics from the
// datapath's verdict counters when scraped, named with the names flows
// get: the counters run whether or not verdict events are on, so the
// metrics never go silent with --flow-events=false.
type verdictCollector struct {
	src   verdictCounter // nil: none
	names func() *flowNames
}

var (
	verdictsDesc = prometheus.NewDesc(metricVerdicts,
		"Policy verdicts of the datapath: drops and the first packet of each allowed connection.", []string{"verdict", "direction", "stage"}, nil)
	dropsDesc = prometheus.NewDesc(metricDrops,
		"Denied and rejected verdicts by the policy that decided; NetworkPolicy default deny has action DefaultDeny and no policy.",
		[]string{"kind", "namespace", "policy", "action"}, nil)
	loggedDesc = prometheus.NewDesc(metricLogged, "Verdicts a Log rule saw, by its policy.", []string{"kind", "policy"}, nil)
)

func (c *verdictCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- verdictsDesc
	ch <- dropsDesc
	ch <- loggedDesc
}

func (c *verdictCollector) Collect(ch chan<- prometheus.Metric) {
	if c.src == nil {
		return
	}
	counts, err := c.src.VerdictCounts()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(verdictsDesc, err)
		return
	}
	var names *flowNames
	if c.names != nil {
		names = c.names()
	}
	verdicts, drops, logged := map[[3]string]uint64{}, map[[4]string]uint64{}, map[[2]string]uint64{}
	for _, vc := range counts {
		f := names.explainCount(vc)
		verdicts[[3]string{f.Verdict, f.Direction, f.Stage}] += vc.Count
		if f.Verdict != policy.VerdictAllow.String() {
			kind, ns, name, action := dropCause(f)
			drops[[4]string{kind, ns, name, action}] += vc.Count
		}
		if r := f.LoggedBy; r != nil {
			logged[[2]string{r.Kind, r.Name}] += vc.Count
		}
	}
	for l, n := range verdicts {
		ch <- prometheus.MustNewConstMetric(verdictsDesc, prometheus.CounterValue, float64(n), l[:]...)
	}
	for l, n := range drops {
		ch <- prometheus.MustNewConstMetric(dropsDesc, prometheus.CounterValue, float64(n), l[:]...)
	}
	for l, n := range logged {
		ch <- prometheus.MustNewConstMetric(loggedDesc, prometheus.CounterValue, float64(n), l[:]...)
	}
}

// countHTTP counts the requests of a request record.
func (m *metrics) countHTTP(f api.Flow) {
	if m == nil || f.HTTP == nil {
		return
	}
	status, kind, ns, name := "", "", "", ""
	if f.HTTP.Status != 0 {
		status = strconv.Itoa(f.HTTP.Status)
	}
	if d := f.Decider; d != nil {
		kind, ns, name = d.Kind, d.Namespace, d.Name
	}
	n := f.Count
	if n == 0 {
		n = 1
	}
	// An allowed request's status is the server's answer, counted as
	// one; a request's own label is the answer Weir wrote.
	if f.Verdict == "allowed" && f.HTTP.Status != 0 {
		m.httpReplies.WithLabelValues(status, kind, ns, name).Add(float64(n))
		m.httpReplySeconds.WithLabelValues(status, kind, ns, name).Add(f.HTTP.Latency.Seconds() * float64(n))
		status = ""
	}
	if !f.HTTP.Reply {
		m.httpRequests.WithLabelValues(f.Verdict, status, kind, ns, name).Add(float64(n))
	}
}

// dropCause is the kind, namespace, policy and action labels of a drop.
func dropCause(f api.Flow) (kind, namespace, name, action string) {
	action = "Deny"
	if f.Verdict == policy.VerdictReject.String() {
		action = "Reject"
	}
	switch {
	case f.Decider != nil:
		d := f.Decider
		if d.Action != "" {
			action = d.Action
		}
		return d.Kind, d.Namespace, d.Name, action
	case f.Stage == policy.StageNetworkPolicyDefaultDeny.String():
		ns, _, ok := strings.Cut(f.Pod, "/")
		if !ok {
			ns = "" // a veth the agent could not name
		}
		return policy.KindNetworkPolicy, ns, "", "DefaultDeny"
	}
	return "", "", "", action // a rule no longer loaded
}

// reconciled records one policy load: its time, its outcome and, when it
// succeeded, how many policy map entries it left.
func (m *metrics) reconciled(took time.Duration, res *policy.Result, eps map[string]datapath.PolicyEndpoint, err error) {
	m.reconcile.Observe(took.Seconds())
	if err != nil || res == nil {
		m.reconcileErrors.Inc()
		m.maps.policyEntries.Store(-1) // partly written: count the map instead
		return
	}
	var n int64
	for pod, loc := range eps {
		if ep := res.Endpoints[pod]; ep != nil && loc.Ifindex != 0 {
			n += int64(len(ep.Entries))
		}
	}
	m.maps.policyEntries.Store(n)
}

// datapathCollector reads the datapath's counters when scraped.
type datapathCollector struct{ dp Datapath }

var (
	packetsDesc = prometheus.NewDesc(metricPackets,
		"Packets by what the datapath did with them (its per-CPU counters, summed).", []string{"outcome"}, nil)
	eventsLostDesc = prometheus.NewDesc(metricEventsLost,
		"Verdict events the datapath could not queue; flows and verdict metrics miss them.", nil, nil)
)

func (c datapathCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- packetsDesc
	ch <- eventsLostDesc
}

func (c datapathCollector) Collect(ch chan<- prometheus.Metric) {
	counters, err := c.dp.Metrics()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(packetsDesc, err)
		return
	}
	for name, v := range counters {
		if name == datapathEventLostMetric {
			ch <- prometheus.MustNewConstMetric(eventsLostDesc, prometheus.CounterValue, float64(v))
			continue
		}
		ch <- prometheus.MustNewConstMetric(packetsDesc, prometheus.CounterValue, float64(v), name)
	}
}

// l7Counter is what the L7 metrics need from the datapath; a node whose
// L7 path is not set up answers with an error and has none.
type l7Counter interface {
	L7Stats() (datapath.L7Stats, error)
}

// l7Collector serves the L7 socket path's counters when scraped.
type l7Collector struct{ src l7Counter }

var l7Desc = prometheus.NewDesc(metricL7,
	"Counters of the in-kernel HTTP reader (bpf/lib/l7sock.h), summed over CPUs.", []string{"counter"}, nil)

func (c l7Collector) Describe(ch chan<- *prometheus.Desc) { ch <- l7Desc }

func (c l7Collector) Collect(ch chan<- prometheus.Metric) {
	if c.src == nil {
		return
	}
	st, err := c.src.L7Stats()
	if err != nil {
		return // no L7 path on this node
	}
	for name, v := range map[string]uint64{
		"sockets": st.Sockets, "join_failed": st.JoinFail, "skbs": st.Messages, "bytes": st.Bytes,
		"requests_allowed": st.Allowed, "requests_denied": st.Denied, "streams_refused": st.Refused,
		"heads_punted": st.Punted, "heads_split": st.Split, "answered": st.Answered,
		"connections_closed": st.Closed, "skbs_without_state": st.NoState, "records_lost": st.EventsLost,
		"denials_pipelined": st.Pipelined, "connections_reset": st.Reset, "resets_unlisted": st.ResetUnlisted,
		"connections_handed": st.Handed, "proxy_forwarded_bytes": st.ProxyForwarded, "proxy_answered": st.ProxyAnswered, "proxy_behind": st.ProxyBehind,
		"clients": st.Clients, "heads_corked": st.Corked, "sends_desync": st.SendDesync,
		"replies": st.Replies, "replies_lost": st.RepliesLost,
		"h2c_connections_handed": st.H2C, "h2c_server_bytes": st.H2CServerBytes,
	} {
		ch <- prometheus.MustNewConstMetric(l7Desc, prometheus.CounterValue, float64(v), name)
	}
}

// proxyCollector serves the L7 proxy's counters when scraped.
type proxyCollector struct{ px *atomic.Pointer[proxy.Proxy] }

var (
	proxyEndedDesc = prometheus.NewDesc(metricProxyEnded,
		"Handed connections the node's L7 proxy ended for a limit: head_timeout (a request head not whole in time), idle, client_share (a client over its share of the slots while few are free).", []string{"reason"}, nil)
	proxyBusyDesc = prometheus.NewDesc(metricProxyBusy, "Slots of the node's L7 proxy serving a connection.", nil, nil)
)

func (c proxyCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- proxyEndedDesc
	ch <- proxyBusyDesc
}

func (c proxyCollector) Collect(ch chan<- prometheus.Metric) {
	px := c.px.Load()
	if px == nil {
		return
	}
	st := px.Stats()
	for reason, v := range map[string]uint64{"head_timeout": st.HeadTimeouts, "idle": st.IdleEnds, "client_share": st.ClientShareEnds} {
		ch <- prometheus.MustNewConstMetric(proxyEndedDesc, prometheus.CounterValue, float64(v), reason)
	}
	ch <- prometheus.MustNewConstMetric(proxyBusyDesc, prometheus.GaugeValue, float64(st.Busy))
}

// flowStoreCollector reads the flow store's statistics when scraped.
type flowStoreCollector struct{ flows *flowLog }

var (
	flowBytesDesc    = prometheus.NewDesc(metricFlowBytes, "Bytes of flow records on disk.", nil, nil)
	flowSegmentsDesc = prometheus.NewDesc(metricFlowSegments, "Segment files of the flow store.", nil, nil)
	flowWrittenDesc  = prometheus.NewDesc(metricFlowWritten,
		"Aggregated flow records written since the agent started.", nil, nil)
	flowDroppedDesc = prometheus.NewDesc(metricFlowDropped,
		"Oldest segments deleted to keep the flow store within its size.", nil, nil)
	flowWriteErrorsDesc = prometheus.NewDesc(metricFlowWriteErrors,
		"Failed writes of the flow store; each loses a window of flows.", nil, nil)
	flowMissedDesc = prometheus.NewDesc(metricFlowFollowMissed,
		"Flows a follower of the flow API (weir observe -f) was too slow to receive.", nil, nil)
)

func (c flowStoreCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{flowBytesDesc, flowSegmentsDesc, flowWrittenDesc, flowDroppedDesc, flowWriteErrorsDesc, flowMissedDesc} {
		ch <- d
	}
}

func (c flowStoreCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.flows.store.Stats()
	ch <- prometheus.MustNewConstMetric(flowBytesDesc, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(flowSegmentsDesc, prometheus.GaugeValue, float64(st.Segments))
	ch <- prometheus.MustNewConstMetric(flowWrittenDesc, prometheus.CounterValue, float64(st.Flows))
	ch <- prometheus.MustNewConstMetric(flowDroppedDesc, prometheus.CounterValue, float64(st.DroppedSegments))
	ch <- prometheus.MustNewConstMetric(flowWriteErrorsDesc, prometheus.CounterValue, float64(st.WriteErrors))
	ch <- prometheus.MustNewConstMetric(flowMissedDesc, prometheus.CounterValue, float64(c.flows.missed.Load()))
}

// mapCounter is what map fill needs from the datapath; *datapath.Node
// has it, a datapath without it has no map metrics.
type mapCounter interface {
	MapCapacity(name string) (int, error)
	MapEntries(name string, limit int) (int, error)
}

// mapUsage is one map's fill at a moment.
type mapUsage struct{ entries, capacity int }

func (u mapUsage) ratio() float64 {
	if u.capacity <= 0 {
		return 0
	}
	return float64(u.entries) / float64(u.capacity)
}

// mapFill counts the datapath's map entries at most every mapCountEvery,
// warns of maps filling up, and serves the counts as metrics.
type mapFill struct {
	src mapCounter // nil: none
	log *slog.Logger
	// policyEntries is what the last policy load left in the policy
	// map, -1 when unknown: the LPM trie holds up to a million entries,
	// too many to count every time.
	policyEntries atomic.Int64
	// identities is how many SecurityIdentities the cluster holds, -1
	// before the first snapshot (Kubernetes mode only).
	identities atomic.Int64

	mu      sync.Mutex // serialises counting
	counted time.Time
	usage   map[string]mapUsage
	alarm   fillAlarm
	// raised, if set, is told of each map that passed the warning
	// threshold (Kubernetes mode: a Warning event on the Node).
	raised func(name string, entries, capacity int)
}

// onRaised sets the function told of each map passing the threshold.
func (f *mapFill) onRaised(fn func(name string, entries, capacity int)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.raised = fn
}

func newMapFill(dp Datapath, log *slog.Logger) *mapFill {
	f := &mapFill{log: log, usage: map[string]mapUsage{}, alarm: fillAlarm{warnAt: fillWarnAt, clearAt: fillClearAt}}
	f.src, _ = dp.(mapCounter)
	f.policyEntries.Store(-1)
	f.identities.Store(-1)
	return f
}

// run counts every mapCountEvery until ctx ends, so a filling map is
// warned about whether or not anyone scrapes.
func (f *mapFill) run(ctx context.Context) {
	if f.src == nil {
		return
	}
	t := time.NewTicker(mapCountEvery)
	defer t.Stop()
	for {
		f.current(0)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// current returns the counts, counting again if they are older than
// maxAge.
func (f *mapFill) current(maxAge time.Duration) map[string]mapUsage {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.src != nil && (f.counted.IsZero() || time.Since(f.counted) >= maxAge) {
		f.count()
		f.counted = time.Now()
	}
	out := make(map[string]mapUsage, len(f.usage))
	for k, v := range f.usage {
		out[k] = v
	}
	return out
}

func (f *mapFill) count() {
	for _, name := range datapath.FillMaps {
		capacity, err := f.src.MapCapacity(name)
		if err != nil {
			f.log.Warn("read map capacity", "map", name, "err", err)
			continue
		}
		entries := int(f.policyEntries.Load())
		if name != datapath.MapPolicy || entries < 0 {
			if entries, err = f.src.MapEntries(name, capacity); err != nil {
				f.log.Warn("count map entries", "map", name, "err", err)
				continue
			}
		}
		f.observe(name, entries, capacity)
	}
	if n := f.identities.Load(); n >= 0 {
		f.observe(fillIdentities, int(n), identitySpace)
	}
}

// fillIdentities names the cluster's identity space among the maps: not
// a BPF map, but it fills the same way and fails closed when full (a
// label set with no identity is unidentified, denied wherever a policy
// applies).
const fillIdentities = "security_identities"

// identitySpace is how many numbers cluster identities can take.
const identitySpace = int(policy.MaxClusterIdentity - policy.MinClusterIdentity + 1)

// observe records one count and warns when it crosses the threshold.
func (f *mapFill) observe(name string, entries, capacity int) {
	u := mapUsage{entries: entries, capacity: capacity}
	f.usage[name] = u
	switch f.alarm.observe(name, u.ratio()) {
	case fillRaised:
		f.log.Warn("BPF map nearly full: when full, new connections or policy entries fail", "map", name,
			"entries", entries, "capacity", capacity, "percent", int(100*u.ratio()))
		if f.raised != nil {
			f.raised(name, entries, capacity)
		}
	case fillCleared:
		f.log.Info("BPF map no longer nearly full", "map", name, "entries", entries, "capacity", capacity)
	}
}

var (
	mapEntriesDesc = prometheus.NewDesc(metricMapEntries,
		"Entries in a datapath map (policy: as the agent last wrote it).", []string{"map"}, nil)
	mapCapacityDesc = prometheus.NewDesc(metricMapCapacity, "A datapath map's max_entries.", []string{"map"}, nil)
	mapFillDesc     = prometheus.NewDesc(metricMapFill,
		"Entries over capacity; the agent warns past 0.8. A full conntrack map evicts live connections, a full policy map fails closed.", []string{"map"}, nil)
)

func (f *mapFill) Describe(ch chan<- *prometheus.Desc) {
	ch <- mapEntriesDesc
	ch <- mapCapacityDesc
	ch <- mapFillDesc
}

func (f *mapFill) Collect(ch chan<- prometheus.Metric) {
	// A scrape uses the background count; it counts itself only when
	// that stopped (or never ran).
	for name, u := range f.current(2 * mapCountEvery) {
		ch <- prometheus.MustNewConstMetric(mapEntriesDesc, prometheus.GaugeValue, float64(u.entries), name)
		ch <- prometheus.MustNewConstMetric(mapCapacityDesc, prometheus.GaugeValue, float64(u.capacity), name)
		ch <- prometheus.MustNewConstMetric(mapFillDesc, prometheus.GaugeValue, u.ratio(), name)
	}
}

// fillChange is what one observation of a map's fill changed.
type fillChange int

const (
	fillSame    fillChange = iota
	fillRaised             // passed warnAt: warn
	fillCleared            // fell below clearAt after a warning
)

// fillAlarm decides when a map's fill deserves a warning: when it
// passes warnAt, and again only after it fell below clearAt, so a map
// hovering at the threshold warns once.
type fillAlarm struct {
	warnAt, clearAt float64
	raised          map[string]bool
}

func (a *fillAlarm) observe(name string, ratio float64) fillChange {
	if a.raised == nil {
		a.raised = map[string]bool{}
	}
	switch {
	case !a.raised[name] && ratio >= a.warnAt:
		a.raised[name] = true
		return fillRaised
	case a.raised[name] && ratio < a.clearAt:
		delete(a.raised, name)
		return fillCleared
	}
	return fillSame
}

package flowstore

import (
	"cmp"
	"strings"
	"time"

	"github.com/weirnet/weir/internal/api"
)

// key is what makes flows the same record: every field that names the
// parties, the port, the Service, the verdict or the rules that led to
// it, and neither the time nor the source port. PeerLabels is left out: it is a slice,
// and it follows from PeerIdentity.
type key struct {
	node, pod, direction, verdict, stage string
	src, dst, proto, peer, rule          string
	peerIdentity                         uint32
	decider, loggedBy, passedBy          api.FlowRule // zero: none
	service, serviceAddr                 string
	serviceByClient                      bool
	http                                 httpKey // zero: a connection's record
}

// httpKey is what makes requests the same record: everything of
// api.FlowHTTP but the latencies, which a record of answers sums.
type httpKey struct {
	method, host, target, reason  string
	status                        int
	targetCut, closed, set, reply bool
	rule                          api.FlowHTTPRule
}

func keyOf(f api.Flow) key {
	return key{
		node: f.Node, pod: f.Pod, direction: f.Direction, verdict: f.Verdict, stage: f.Stage,
		src: srcAddr(f.Src), dst: f.Dst, proto: f.Proto, peer: f.Peer, rule: f.Rule,
		peerIdentity: f.PeerIdentity,
		decider:      ruleOf(f.Decider), loggedBy: ruleOf(f.LoggedBy), passedBy: ruleOf(f.PassedBy),
		service: f.Service, serviceAddr: f.ServiceAddr, serviceByClient: f.ServiceByClient,
		http: httpKeyOf(f.HTTP),
	}
}

func httpKeyOf(h *api.FlowHTTP) httpKey {
	if h == nil {
		return httpKey{}
	}
	k := httpKey{method: h.Method, host: h.Host, target: h.Target, reason: h.Reason, status: h.Status,
		targetCut: h.TargetCut, closed: h.Closed, set: true, reply: h.Reply}
	if h.Rule != nil {
		k.rule = *h.Rule
	}
	return k
}

func ruleOf(r *api.FlowRule) api.FlowRule {
	if r == nil {
		return api.FlowRule{}
	}
	return *r
}

// srcAddr drops the port of an address:port, keeping an IPv6 address
// without its brackets. It slices rather than parses because it runs for
// every flow added. Anything else (no port, a bare IPv6 address) is kept
// as it is.
func srcAddr(s string) string {
	i := strings.LastIndexByte(s, ':')
	if i < 0 || !isPort(s[i+1:]) {
		return s
	}
	host := s[:i]
	if len(host) >= 2 && host[0] == '[' && host[len(host)-1] == ']' {
		return host[1 : len(host)-1]
	}
	if strings.IndexByte(host, ':') >= 0 {
		return s // a bare IPv6 address: its last group is no port
	}
	return host
}

func isPort(s string) bool {
	if s == "" || len(s) > 5 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// span is a flow's count and times as an aggregate: a single flow counts
// one, first and last at its time, or now when it has none.
func span(f api.Flow, now func() time.Time) (n uint64, first, last time.Time) {
	n, first, last = f.Count, f.Time, f.LastTime
	if n == 0 {
		n = 1
	}
	if first.IsZero() {
		first = now()
	}
	if last.IsZero() || last.Before(first) {
		last = first
	}
	return n, first, last
}

// newAggregate starts a record from its first flow. The flow's slices are
// kept, not copied: flows are not changed once made.
func newAggregate(f api.Flow, k key, now func() time.Time) *api.Flow {
	agg := f
	agg.Src = k.src
	agg.Count, agg.Time, agg.LastTime = span(f, now)
	return &agg
}

// merge counts f into agg.
func merge(agg *api.Flow, f api.Flow, now func() time.Time) {
	n, first, last := span(f, now)
	if agg.HTTP != nil && f.HTTP != nil && (agg.HTTP.Latency > 0 || f.HTTP.Latency > 0) {
		// The mean over both, each weighted by its answers, in a copy:
		// a query may hold the aggregate's HTTP it read under the lock.
		h := new(api.FlowHTTP)
		*h = *agg.HTTP
		agg.HTTP = h
		h.Latency = time.Duration((float64(h.Latency)*float64(agg.Count) + float64(f.HTTP.Latency)*float64(n)) /
			float64(agg.Count+n))
		h.LatencyMax = max(h.LatencyMax, f.HTTP.LatencyMax)
	}
	agg.Count += n
	if first.Before(agg.Time) {
		agg.Time = first
	}
	if last.After(agg.LastTime) {
		agg.LastTime = last
	}
}

// byLastSeen orders records oldest first by when they were last seen,
// then by their parties, so a window is written in a stable order.
func byLastSeen(a, b api.Flow) int {
	return cmp.Or(a.LastTime.Compare(b.LastTime), a.Time.Compare(b.Time),
		cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.Direction, b.Direction), cmp.Compare(a.Src, b.Src),
		cmp.Compare(a.Dst, b.Dst), cmp.Compare(a.PeerIdentity, b.PeerIdentity),
		cmp.Compare(a.Verdict, b.Verdict), cmp.Compare(a.Stage, b.Stage), cmp.Compare(a.Rule, b.Rule))
}

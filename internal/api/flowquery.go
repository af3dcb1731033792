package api

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
)

// Bounds of a flows query's page.
const (
	DefaultFlowLimit = 4096
	MaxFlowLimit     = 100000
)

// ErrInvalidFlowsQuery marks a flows query the agent cannot run.
var ErrInvalidFlowsQuery = errors.New("invalid flows query")

// FlowsQuery selects flows. The agent runs it against its whole flow
// store and returns the newest Limit records that match, oldest first; a
// record is in a page by its last-seen time, so the next older page is
// the same query with Before set to the oldest record's.
type FlowsQuery struct {
	Follow bool // after the page, keep streaming new flows that match
	FlowFilter
	// Limit bounds the page (0: DefaultFlowLimit, at most MaxFlowLimit).
	Limit int
}

// FlowFilter is what a flow must match; zero fields match everything.
type FlowFilter struct {
	Namespace string // a party (pod or peer) in this namespace
	Pod       string // a party with this name, or namespace/name
	Verdict   string // allowed, denied, rejected or forwarded
	Policy    string // decided, logged or passed by it: name, namespace/name or kind/name
	Port      int    // to this destination port
	Selector  string // the peer's labels match this label selector
	Service   string // through this Service: name or namespace/name
	// HTTP keeps only records of requests; Method, Path (a prefix of the
	// target's path) and Status keep those of such requests, and imply it.
	HTTP   bool
	Method string
	Path   string
	Status int
	Since  time.Time
	Before time.Time // last seen before it (paging)
}

// Values encodes q as URL query parameters.
func (q FlowsQuery) Values() url.Values {
	v := url.Values{}
	set := func(k, val string) {
		if val != "" {
			v.Set(k, val)
		}
	}
	if q.Follow {
		v.Set("follow", "1")
	}
	set("namespace", q.Namespace)
	set("pod", q.Pod)
	set("verdict", q.Verdict)
	set("policy", q.Policy)
	set("selector", q.Selector)
	set("service", q.Service)
	if q.Port != 0 {
		v.Set("port", strconv.Itoa(q.Port))
	}
	if q.HTTP {
		v.Set("http", "1")
	}
	set("method", q.Method)
	set("path", q.Path)
	if q.Status != 0 {
		v.Set("status", strconv.Itoa(q.Status))
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if !q.Before.IsZero() {
		v.Set("before", q.Before.UTC().Format(time.RFC3339Nano))
	}
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	return v
}

// ParseFlowsQuery decodes and checks the parameters Values encodes.
func ParseFlowsQuery(v url.Values) (FlowsQuery, error) {
	q := FlowsQuery{Follow: v.Get("follow") != "", FlowFilter: FlowFilter{
		Namespace: v.Get("namespace"), Pod: v.Get("pod"), Verdict: v.Get("verdict"),
		Policy: v.Get("policy"), Selector: v.Get("selector"), Service: v.Get("service"),
		HTTP: v.Get("http") != "", Method: v.Get("method"), Path: v.Get("path"),
	}}
	var err error
	for name, n := range map[string]*int{"port": &q.Port, "status": &q.Status} {
		if s := v.Get(name); s != "" {
			if *n, err = strconv.Atoi(s); err != nil {
				return q, fmt.Errorf("%s %q: %w", name, s, ErrInvalidFlowsQuery)
			}
		}
	}
	for name, t := range map[string]*time.Time{"since": &q.Since, "before": &q.Before} {
		if s := v.Get(name); s != "" {
			if *t, err = time.Parse(time.RFC3339Nano, s); err != nil {
				return q, fmt.Errorf("%s %q: want an RFC 3339 time: %w", name, s, ErrInvalidFlowsQuery)
			}
		}
	}
	if s := v.Get("limit"); s != "" {
		if q.Limit, err = strconv.Atoi(s); err != nil {
			return q, fmt.Errorf("limit %q: %w", s, ErrInvalidFlowsQuery)
		}
	}
	return q, q.Validate()
}

// Validate says what is wrong with q, if anything.
func (q FlowsQuery) Validate() error {
	switch q.Verdict {
	case "", "allowed", "denied", "rejected", "forwarded", "refused", "unjudged":
	default:
		return fmt.Errorf("verdict %q: want allowed, denied, rejected, forwarded, refused or unjudged: %w", q.Verdict, ErrInvalidFlowsQuery)
	}
	if q.Status != 0 && (q.Status < 100 || q.Status > 599) {
		return fmt.Errorf("status %d: want an HTTP status from 100 to 599: %w", q.Status, ErrInvalidFlowsQuery)
	}
	if q.Path != "" && !strings.HasPrefix(q.Path, "/") {
		return fmt.Errorf("path %q: want a path starting with /: %w", q.Path, ErrInvalidFlowsQuery)
	}
	if q.Port < 0 || q.Port > 65535 {
		return fmt.Errorf("port %d: want 1 to 65535: %w", q.Port, ErrInvalidFlowsQuery)
	}
	if q.Limit < 0 || q.Limit > MaxFlowLimit {
		return fmt.Errorf("limit %d: want 1 to %d: %w", q.Limit, MaxFlowLimit, ErrInvalidFlowsQuery)
	}
	if _, err := labels.Parse(q.Selector); err != nil {
		return fmt.Errorf("selector %q: %v: %w", q.Selector, err, ErrInvalidFlowsQuery)
	}
	return nil
}

// PageSize is the page's bound: Limit, or the default.
func (q FlowsQuery) PageSize() int {
	if q.Limit == 0 {
		return DefaultFlowLimit
	}
	return q.Limit
}

// Matcher returns the filter as a function; the filter must be valid.
func (f FlowFilter) Matcher() func(Flow) bool {
	sel, err := labels.Parse(f.Selector)
	if err != nil {
		sel = labels.Nothing()
	}
	port := strconv.Itoa(f.Port)
	return func(fl Flow) bool {
		if f.Verdict != "" && fl.Verdict != f.Verdict {
			return false
		}
		if !f.matchesHTTP(fl.HTTP) {
			return false
		}
		if f.Port != 0 {
			if _, p, err := net.SplitHostPort(fl.Dst); err != nil || p != port {
				return false
			}
		}
		last := LastSeen(fl)
		if (!f.Since.IsZero() && last.Before(f.Since)) || (!f.Before.IsZero() && !last.Before(f.Before)) {
			return false
		}
		if f.Policy != "" && !namesPolicy(f.Policy, fl.Decider, fl.LoggedBy, fl.PassedBy) {
			return false
		}
		if !sel.Empty() && !sel.Matches(peerLabels(fl.PeerLabels)) {
			return false
		}
		if f.Service != "" && fl.Service != f.Service && !strings.HasSuffix(fl.Service, "/"+f.Service) {
			return false
		}
		parties := []string{fl.Pod, fl.Peer}
		if f.Namespace != "" && !strings.HasPrefix(fl.Pod, f.Namespace+"/") && !strings.HasPrefix(fl.Peer, f.Namespace+"/") {
			return false
		}
		if f.Pod != "" {
			for _, p := range parties {
				if p == f.Pod || strings.HasSuffix(p, "/"+f.Pod) {
					return true
				}
			}
			return false
		}
		return true
	}
}

// matchesHTTP holds a record's request to the HTTP filters.
func (f FlowFilter) matchesHTTP(h *FlowHTTP) bool {
	if !f.HTTP && f.Method == "" && f.Path == "" && f.Status == 0 {
		return true
	}
	if h == nil {
		return false
	}
	path, _, _ := strings.Cut(h.Target, "?")
	switch {
	case f.Method != "" && h.Method != f.Method:
		return false
	case f.Path != "" && path != f.Path && !strings.HasPrefix(path, strings.TrimSuffix(f.Path, "/")+"/"):
		return false
	case f.Status != 0 && h.Status != f.Status:
		return false
	}
	return true
}

// LastSeen is when an aggregate last saw its flow, or a flow's time.
func LastSeen(fl Flow) time.Time {
	if fl.LastTime.After(fl.Time) {
		return fl.LastTime
	}
	return fl.Time
}

// namesPolicy reports whether one of the rules belongs to the policy
// named by want: its name, namespace/name, or kind/name.
func namesPolicy(want string, rules ...*FlowRule) bool {
	for _, r := range rules {
		if r == nil {
			continue
		}
		if want == r.Name || want == r.Namespace+"/"+r.Name || strings.EqualFold(want, r.Kind+"/"+r.Name) {
			return true
		}
	}
	return false
}

// peerLabels turns identity labels ("k8s:app=db", "ns:team=a") into the
// pod's own labels for a selector; namespace labels stay prefixed.
func peerLabels(ids []string) labels.Set {
	out := labels.Set{}
	for _, l := range ids {
		k, v, _ := strings.Cut(l, "=")
		out[strings.TrimPrefix(k, "k8s:")] = v
	}
	return out
}

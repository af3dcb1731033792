package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/weirnet/weir/internal/agent"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/lab"
	"github.com/weirnet/weir/internal/policy"
	"github.com/weirnet/weir/internal/proxy"
)

// The l7-gate scenario measures what routing an accepted socket's
// inbound bytes through verdict programs costs (issue 20's design gate):
// nginx serving keep-alive requests from wrk at 100 connections, on a
// port left alone and on ports whose sockets join the strparser and the
// skb-verdict socket hashes of bpf/l7.c, whose verdicts pass everything,
// and the HTTP hash, whose verdict reads every request and judges it
// against 1 or 40 HTTP rules. One nginx serves every port, so the setups
// differ in the socket path alone.
const (
	l7GateLab    = "wb-l7"
	l7GatePath   = "keepalive"
	l7GatePlain  = "no policy"
	l7GateStrp   = "strparser (pass)"
	l7GateSkb    = "skb verdict (pass)"
	l7GateHTTP1  = "kernel HTTP, 1 rule"
	l7GateHTTP40 = "kernel HTTP, 40 rules"
	// Every request to its own path: none repeats the one before, so
	// each is a request record of its own, read by the agent's record
	// path (agent.RequestRecorder) as it comes.
	l7GatePlainNew = "no policy, new paths"
	l7GateHTTP1New = "kernel HTTP, 1 rule, new paths"
	// One rule whose path is a regular expression, judged in the kernel
	// by the set's automaton (bpf/lib/l7dfa.h).
	l7GateHTTPRegex = "kernel HTTP, 1 path regex rule"
	// One rule with a header's regular expression, which the kernel
	// leaves to user space: every connection is handed to the proxy
	// (internal/proxy) at its first request, which judges all of its
	// requests from then on.
	l7GateUser = "user-space HTTP, 1 header regex rule"
	// One cluster-tier rule with an HTTP rule (a conditional Accept of
	// GET / before a Deny of all): its flows are handed to the proxy at
	// their first request, which judges every request against the
	// policy, walking the precedence order (proxy.TierJudge).
	l7GateTiers = "user-space HTTP, cluster-tier rule"
	// HTTP/2 over cleartext (gRPC's transport), h2load's requests, one
	// stream at a time on each of the same number of connections: a
	// port left alone, and one with 1 HTTP rule, whose connections the
	// kernel hands whole to the proxy at their preface, which speaks
	// HTTP/2 with both ends and judges every request (internal/proxy).
	l7GateH2Plain  = "h2c, no policy"
	l7GateH2One    = "h2c, 1 rule (the proxy, HTTP/2 both ways)"
	l7GateConns    = 100
	l7GatePortOff  = 8080
	l7GatePortStr  = 8081
	l7GatePortSkb  = 8082
	l7GatePortH1   = 8083
	l7GatePortH40  = 8084
	l7GatePortOffN = 8085
	l7GatePortH1N  = 8086
	l7GatePortUser = 8087
	l7GatePortRe   = 8088
	l7GatePortTier = 8089
	l7GatePortH2   = 8090
	l7GatePortH2R1 = 8091
	// l7GateSlots are the proxy's hand-off slots: one per connection.
	l7GateSlots = 2 * l7GateConns
)

// l7GateRatePath is the constant-rate runs: each setup of
// l7GateRateSetups at half the plain port's requests/s of the same
// repetition (issue 20: p99 with HTTP rules at most twice no policy's at
// that rate), sent by fortio's periodic runner over the same connections.
const l7GateRatePath = "constant rate"

// l7WantRateP99 is issue 20's bound on p99 latency with HTTP rules at
// the constant rate, as a multiple of no policy's.
const l7WantRateP99 = 2.0

// l7GateRateSetups are the setups run at the constant rate: the plain
// port and the kernel's and the proxy's HTTP paths.
var l7GateRateSetups = []string{l7GatePlain, l7GateHTTP1, l7GateHTTP40, l7GateUser}

// l7GateSetups are the setups in report order.
var l7GateSetups = []string{l7GatePlain, l7GateStrp, l7GateSkb, l7GateHTTP1, l7GateHTTP40, l7GateHTTPRegex, l7GateUser, l7GateTiers, l7GatePlainNew, l7GateHTTP1New,
	l7GateH2Plain, l7GateH2One}

// l7GateBaseline is the setup a setup's ratio is taken to: the plain
// port with the same requests.
func l7GateBaseline(setup string) string {
	switch setup {
	case l7GateHTTP1New:
		return l7GatePlainNew
	case l7GateH2One:
		return l7GateH2Plain
	}
	return l7GatePlain
}

// l7GateNewPaths is wrk's script for the new-paths setups: GET
// /item/<n>, n counting up on each of wrk's connections' requests.
const l7GateNewPaths = `local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/item/" .. n)
end
`

// Issue 20's targets for requests/s with HTTP rules, as a share of no
// policy; here measured on the gate's veth pair, the lab's bench l7 to
// come.
const (
	l7WantOneRule    = 0.70
	l7WantFortyRules = 0.65
)

// l7GateRules are the HTTP rules of a set of n: wrk's "GET /" matches
// only the last, the others differ from it in method, path or host, as
// an API's rules would.
func l7GateRules(n int) []l7.Rule {
	var rules []l7.Rule
	for i := 0; len(rules) < n-1; i++ {
		switch i % 4 {
		case 0:
			rules = append(rules, l7.Rule{Method: "POST", Path: &l7.PathMatch{Type: l7.PathExact, Value: fmt.Sprintf("/api/v1/orders/%d", i)}})
		case 1:
			rules = append(rules, l7.Rule{Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: fmt.Sprintf("/api/v%d", i)}})
		case 2:
			rules = append(rules, l7.Rule{Method: "PUT", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/"}})
		default:
			rules = append(rules, l7.Rule{Method: "GET", Hostnames: []string{fmt.Sprintf("svc%d.example.com", i)}})
		}
	}
	return append(rules, l7.Rule{Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/"}})
}

// l7GateWant is the gate: a path that keeps less than this share of the
// plain requests/s cannot host a parser and still reach issue 20's 0.70.
const l7GateWant = 0.80

var wrkLatencyPct = regexp.MustCompile(`(?m)^\s+(50|99)%\s+([0-9.]+)(us|ms|s)\s*$`)

// l7GateSetup is one setup: its name and the port whose sockets take its
// path.
type l7GateSetup struct {
	name     string
	port     int
	mode     datapath.L7Mode // 0: plain
	rules    int             // L7HTTP: the set's rule count
	newPaths bool            // every request to its own path (l7GateNewPaths)
	// L7HTTP: set, when not nil, makes the rules in place of
	// l7GateRules; handed says they are judged in user space; tiers
	// that the port's set is a cluster tier's (l7GateTierPolicy),
	// marked datapath.L7SetTiered and never written to the kernel.
	set    func() []l7.Rule
	handed bool
	tiers  bool
	// h2: nginx serves the port over HTTP/2 (h2c) and h2load loads it.
	h2 bool
}

// l7GatePathRegexRules is one rule wrk's GET / meets only by its path's
// regular expression, which the kernel's automaton judges.
func l7GatePathRegexRules() []l7.Rule {
	return []l7.Rule{{Method: "GET", Path: &l7.PathMatch{Type: l7.PathRegularExpression, Value: "/[a-z0-9/]*"}}}
}

// l7GateHeaderRegexRules is one rule wrk's GET / meets only by its Host
// header's regular expression, which the kernel leaves to user space.
func l7GateHeaderRegexRules() []l7.Rule {
	return []l7.Rule{{Method: "GET", Headers: []l7.HeaderMatch{{Name: "Host", Type: l7.HeaderRegularExpression, Value: "[0-9.]+:[0-9]+"}}}}
}

func runL7Gate(ctx context.Context, o options, out io.Writer) (retErr error) {
	if os.Geteuid() != 0 {
		return errors.New("the benchmark needs root (network namespaces, eBPF, cgroups)")
	}
	started := time.Now()
	lab.Down(ctx, l7GateLab, io.Discard) // a leftover of an interrupted run
	pair, err := lab.UpVethPair(l7GateLab, 1500)
	if err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, lab.Down(context.Background(), l7GateLab, io.Discard)) }()
	cg, release, err := l7GateCgroup()
	if err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, release()) }()
	socks, err := datapath.AttachL7Sockets(cg, datapath.L7FlowMaps{})
	if err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, socks.Close()) }()
	setups := []l7GateSetup{{name: l7GatePlain, port: l7GatePortOff}, {name: l7GateStrp, port: l7GatePortStr, mode: datapath.L7StrParser},
		{name: l7GateSkb, port: l7GatePortSkb, mode: datapath.L7SkbVerdict}, {name: l7GateHTTP1, port: l7GatePortH1, mode: datapath.L7HTTP, rules: 1},
		{name: l7GateHTTP40, port: l7GatePortH40, mode: datapath.L7HTTP, rules: 40},
		{name: l7GateHTTPRegex, port: l7GatePortRe, mode: datapath.L7HTTP, rules: 1, set: l7GatePathRegexRules},
		{name: l7GateUser, port: l7GatePortUser, mode: datapath.L7HTTP, rules: 1, set: l7GateHeaderRegexRules, handed: true},
		{name: l7GateTiers, port: l7GatePortTier, mode: datapath.L7HTTP, rules: 1, handed: true, tiers: true},
		{name: l7GatePlainNew, port: l7GatePortOffN, newPaths: true}, {name: l7GateHTTP1New, port: l7GatePortH1N, mode: datapath.L7HTTP, rules: 1, newPaths: true},
		{name: l7GateH2Plain, port: l7GatePortH2, h2: true}, {name: l7GateH2One, port: l7GatePortH2R1, mode: datapath.L7HTTP, rules: 1, handed: true, h2: true}}
	script, err := os.CreateTemp("", "weir-l7gate-*.lua")
	if err != nil {
		return err
	}
	defer os.Remove(script.Name())
	if _, err := script.WriteString(l7GateNewPaths); err != nil {
		return err
	}
	script.Close()
	records, err := recordRequests(socks)
	if err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, records.close()) }()
	tierPolicy, err := l7GateTierPolicy(pair.AddrA, pair.AddrB, l7GatePortTier)
	if err != nil {
		return err
	}
	handed, err := startL7GateProxy(socks, tierPolicy, pair.AddrB)
	if err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, handed.close()) }()
	var ports, h2Ports []int
	for i, s := range setups {
		if s.h2 {
			h2Ports = append(h2Ports, s.port)
		} else {
			ports = append(ports, s.port)
		}
		switch s.mode {
		case 0:
			continue
		case datapath.L7HTTP:
			if s.tiers {
				if err := socks.EnforceHTTP(uint16(s.port), datapath.L7SetTiered|uint32(i)); err != nil {
					return err
				}
				continue
			}
			rules := l7GateRules(s.rules)
			if s.set != nil {
				rules = s.set()
			}
			if s.handed {
				m, err := l7.Compile(rules)
				if err != nil {
					return err
				}
				handed.matchers.Put(uint32(i), m)
			}
			k, err := l7.CompileKernel(rules, socks.HashKey())
			if err != nil {
				return err
			}
			if err := socks.WriteHTTPSet(uint32(i), k); err != nil {
				return err
			}
			err = socks.EnforceHTTP(uint16(s.port), uint32(i))
			if err != nil {
				return err
			}
		default:
			if err := socks.EnforcePort(uint16(s.port), s.mode); err != nil {
				return err
			}
		}
	}
	nginx, err := startNginx(ctx, pair.NSB, cg, pair.AddrB.String(), ports, h2Ports)
	if err != nil {
		return err
	}
	defer nginx.stop()

	res := &result{Scenario: "l7-gate", Command: invocation, Commit: sourceCommit(), Started: started.UTC().Format(time.RFC3339),
		Machine: machine(), Reps: o.reps, DurationS: o.duration.Seconds(), WarmupS: o.warmup.Seconds()}
	run := func(s l7GateSetup, d time.Duration) (wrkRun, error) {
		before, err := socks.Stats()
		if err != nil {
			return wrkRun{}, err
		}
		recordsBefore, proxiedBefore := records.count.Load(), handed.allowed.Load()
		lua := ""
		if s.newPaths {
			lua = script.Name()
		}
		url := fmt.Sprintf("http://%s:%d/", pair.AddrB, s.port)
		var w wrkRun
		if s.h2 {
			w, err = h2loadRun(ctx, pair.NSA, url, d)
		} else {
			w, err = wrkKeepAlive(ctx, pair.NSA, url, d, lua)
		}
		if err != nil {
			return w, fmt.Errorf("%s: %w", s.name, err)
		}
		after, err := socks.Stats()
		if err != nil {
			return w, err
		}
		w.joined = float64(after.Sockets - before.Sockets)
		w.judged = float64(after.Allowed - before.Allowed)
		w.recordsLost = float64(after.EventsLost - before.EventsLost)
		w.records = float64(records.count.Load() - recordsBefore)
		w.proxied = float64(handed.allowed.Load() - proxiedBefore)
		if s.handed {
			// Every connection handed at its first request, every
			// request allowed by the proxy, none closed.
			if n := after.Denied + after.Refused + after.Split + after.Closed - before.Denied - before.Refused - before.Split - before.Closed; n != 0 {
				return w, fmt.Errorf("%s: %d requests or connections were not handed and allowed (%+v)", s.name, n, after)
			}
			if got := after.Handed - before.Handed; got < l7GateConns {
				return w, fmt.Errorf("%s: %d of %d connections handed to the proxy", s.name, got, l7GateConns)
			}
			if w.proxied < w.rps*d.Seconds()*0.9 {
				return w, fmt.Errorf("%s: %v requests allowed by the proxy for %.0f req/s over %v", s.name, w.proxied, w.rps, d)
			}
			if got := after.H2C - before.H2C; s.h2 && got < l7GateConns {
				return w, fmt.Errorf("%s: %d of %d connections handed to the proxy as HTTP/2", s.name, got, l7GateConns)
			}
		} else if s.mode == datapath.L7HTTP {
			// Every request read and allowed, no connection cut short.
			if n := after.Denied + after.Refused + after.Punted + after.Split + after.Closed - before.Denied - before.Refused - before.Punted - before.Split - before.Closed; n != 0 {
				return w, fmt.Errorf("%s: %d requests or connections were not simply allowed (%+v)", s.name, n, after)
			}
			if w.judged < w.rps*d.Seconds()*0.9 {
				return w, fmt.Errorf("%s: %v requests judged for %.0f req/s over %v", s.name, w.judged, w.rps, d)
			}
		}
		// A figure of a path the sockets did not take would be a lie.
		if s.mode != 0 && w.joined < l7GateConns {
			return w, fmt.Errorf("%s: %v of %d connections joined the socket hash", s.name, w.joined, l7GateConns)
		}
		if s.mode == 0 && w.joined != 0 {
			return w, fmt.Errorf("%s: %v sockets of the plain port joined a socket hash", s.name, w.joined)
		}
		return w, nil
	}
	if o.warmup > 0 {
		fmt.Fprintf(out, "==> warm-up: %s of each setup, discarded\n", o.warmup)
		for _, s := range setups {
			if _, err := run(s, o.warmup); err != nil {
				return err
			}
		}
	}
	for rep := 0; rep < o.reps; rep++ {
		for i := range setups {
			s := setups[(rep+i)%len(setups)] // a rotating order
			w, err := run(s, o.duration)
			if err != nil {
				res.Incomplete = err.Error()
				break
			}
			for metric, v := range map[string]float64{"rps": w.rps, "p50_ms": w.p50, "p99_ms": w.p99, "errors": w.errors, "sockets_joined": w.joined,
				"requests_judged": w.judged, "records": w.records, "records_lost": w.recordsLost, "requests_proxied": w.proxied} {
				if math.IsNaN(v) {
					continue // h2load gives no percentiles
				}
				res.Samples = append(res.Samples, sample{Setup: s.name, Path: l7GatePath, Metric: metric, Rep: rep, Value: v})
			}
			fmt.Fprintf(out, "rep %d %-20s %8.0f req/s  p50 %.3f ms  p99 %.3f ms  errors %v\n", rep+1, s.name, w.rps, w.p50, w.p99, w.errors)
		}
		if res.Incomplete == "" {
			if err := runL7GateRate(ctx, res, rep, setups, func(s l7GateSetup, rate float64) (httpRateResult, error) {
				return httpRate(ctx, pair.NSA, httpRateOptions{URL: fmt.Sprintf("http://%s:%d/", pair.AddrB, s.port), Method: "GET",
					QPS: rate, Conns: l7GateConns, D: o.duration})
			}, out); err != nil {
				res.Incomplete = err.Error()
			}
		}
		if res.Incomplete != "" {
			break
		}
	}
	res.summarise()
	res.Finished = time.Now().UTC().Format(time.RFC3339)
	return res.write(o.out, out)
}

// runL7GateRate runs repetition rep's constant-rate runs: each of
// l7GateRateSetups, in a rotating order, at half the plain port's
// requests/s in that repetition, recording the rate asked and got, the
// latency quantiles and every call that did not get a 200.
func runL7GateRate(ctx context.Context, res *result, rep int, setups []l7GateSetup,
	send func(l7GateSetup, float64) (httpRateResult, error), out io.Writer) error {
	most := math.NaN()
	for _, s := range res.Samples {
		if s.Setup == l7GatePlain && s.Path == l7GatePath && s.Metric == "rps" && s.Rep == rep {
			most = s.Value
		}
	}
	if math.IsNaN(most) || most <= 0 {
		return fmt.Errorf("constant rate: no requests/s of %q in repetition %d", l7GatePlain, rep+1)
	}
	rate := most / 2
	for i := range l7GateRateSetups {
		name := l7GateRateSetups[(rep+i)%len(l7GateRateSetups)]
		var s l7GateSetup
		for _, c := range setups {
			if c.name == name {
				s = c
			}
		}
		r, err := send(s, rate)
		if err != nil {
			return fmt.Errorf("%s at %.0f req/s: %w", name, rate, err)
		}
		failed := float64(r.N - r.Codes[200]) // N counts the calls without an answer too
		for metric, v := range map[string]float64{"rate_asked": rate, "rate_got": r.ActualQPS, "p50_ms": r.P50Ms, "p90_ms": r.P90Ms,
			"p99_ms": r.P99Ms, "p999_ms": r.P999Ms, "errors": failed} {
			res.Samples = append(res.Samples, sample{Setup: name, Path: l7GateRatePath, Metric: metric, Rep: rep, Value: v})
		}
		fmt.Fprintf(out, "rep %d %-20s at %6.0f req/s (got %6.0f)  p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  p99.9 %.3f ms  errors %v\n",
			rep+1, name, rate, r.ActualQPS, r.P50Ms, r.P90Ms, r.P99Ms, r.P999Ms, failed)
	}
	return nil
}

// wrkRun is one wrk run's figures.
type wrkRun struct {
	rps, p50, p99, errors, joined, judged float64
	records, recordsLost                  float64 // request records read, and lost by a full ring
	proxied                               float64 // requests the proxy allowed
}

// l7GateProxy is the proxy judging the handed connections, counting the
// requests it allows.
type l7GateProxy struct {
	matchers proxy.Matchers
	opener   *datapath.L7Proxy
	px       *proxy.Proxy
	allowed  atomic.Uint64
}

// startL7GateProxy starts the proxy; it judges the tiered port's
// connections to server against tiers (l7GateTierPolicy), as a node's
// agent does against the policy it loaded.
func startL7GateProxy(socks *datapath.L7Sockets, tiers *policy.Result, server netip.Addr) (*l7GateProxy, error) {
	h := &l7GateProxy{opener: socks.Proxy()}
	judge := &proxy.TierJudge{Sets: proxy.NewSetJudge(h.matchers.Get), Policy: func(a netip.Addr) (*policy.Result, string, bool) {
		return tiers, l7GateTierPod, a == server
	}}
	h.px = proxy.New(judge, h.opener, func(r proxy.Record) {
		if r.Decision.Verdict == proxy.Allow {
			h.allowed.Add(1)
		}
	}, slog.New(slog.DiscardHandler))
	if err := h.px.Start(l7GateSlots); err != nil {
		return nil, errors.Join(err, h.close())
	}
	return h, nil
}

func (h *l7GateProxy) close() error { return errors.Join(h.px.Close(), h.opener.Close()) }

// l7GateTierPod is the server's pod in l7GateTierPolicy.
const l7GateTierPod = "bench/server"

// l7GateTierPolicy is the tiered setup's policy: the server's pod
// (bench/server at server) and the client's (bench/client at client),
// and a WeirClusterNetworkPolicy whose Admin rules on port are a
// conditional Accept of GET / (PathPrefix: every path) and, after it, a
// Deny of all: one HTTP rule, as the other one-rule setups have.
func l7GateTierPolicy(client, server netip.Addr, port int) (*policy.Result, error) {
	ns := policy.Namespace{Name: "bench"}
	pods := []policy.Pod{
		{Namespace: "bench", Name: "server", Labels: map[string]string{"app": "server"}, IPs: []netip.Addr{server}, Local: true},
		{Namespace: "bench", Name: "client", Labels: map[string]string{"app": "client"}, IPs: []netip.Addr{client}},
	}
	p := &policy.ClusterPolicy{Kind: policy.KindWeirClusterNetworkPolicy, Name: "bench-tiers"}
	p.Spec.Tier, p.Spec.Priority = npav1alpha2.AdminTier, 10
	p.Spec.Subject.Pods = &npav1alpha2.NamespacedPod{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}}}
	rule := func(action string) npav1alpha2.ClusterNetworkPolicyIngressRule {
		return npav1alpha2.ClusterNetworkPolicyIngressRule{Action: npav1alpha2.ClusterNetworkPolicyRuleAction(action),
			From: []npav1alpha2.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}},
			Protocols: []npav1alpha2.ClusterNetworkPolicyProtocol{{TCP: &npav1alpha2.ClusterNetworkPolicyProtocolTCP{
				DestinationPort: &npav1alpha2.Port{Number: int32(port)}}}}}
	}
	p.AddIngress(rule("Accept"), []l7.Rule{{Method: "GET", Path: &l7.PathMatch{Type: l7.PathPrefix, Value: "/"}}})
	p.AddIngress(rule("Deny"), nil)
	s := &policy.Snapshot{Namespaces: map[string]policy.Namespace{"bench": ns}, Pods: pods,
		ClusterPolicies: []*policy.ClusterPolicy{p}, Identities: map[string]policy.Identity{}}
	for i, pod := range pods {
		s.Identities[policy.IdentityLabels(ns, pod.Labels).Key()] = policy.MinClusterIdentity + policy.Identity(i)
	}
	res := policy.NewCompiler().Compile(s)
	if len(res.Errors) > 0 {
		return nil, fmt.Errorf("the tiered setup's policy: %w", errors.Join(res.Errors...))
	}
	return res, nil
}

// requestRecords drains the path's request records through the agent's
// record path (agent.RequestRecorder) into a flow store of its own, as
// a node's agent does, counting them.
type requestRecords struct {
	rd    *datapath.L7EventReader
	rec   *agent.RequestRecorder
	dir   string
	count atomic.Uint64
	done  chan struct{}
}

func recordRequests(socks *datapath.L7Sockets) (_ *requestRecords, retErr error) {
	dir, err := os.MkdirTemp("", "weir-l7gate-flows-")
	if err != nil {
		return nil, err
	}
	r := &requestRecords{dir: dir, done: make(chan struct{})}
	defer func() {
		if retErr != nil {
			os.RemoveAll(dir)
		}
	}()
	if r.rec, err = agent.NewRequestRecorder(dir); err != nil {
		return nil, err
	}
	if r.rd, err = socks.OpenEventReader(); err != nil {
		r.rec.Close()
		return nil, err
	}
	go func() {
		defer close(r.done)
		for {
			ev, err := r.rd.Read()
			if errors.Is(err, datapath.ErrEventsClosed) {
				return
			}
			if err == nil {
				r.rec.Record(ev)
				r.count.Add(1)
			}
		}
	}()
	return r, nil
}

func (r *requestRecords) close() error {
	err := r.rd.Close()
	<-r.done
	return errors.Join(err, r.rec.Close(), os.RemoveAll(r.dir))
}

// wrkKeepAlive runs wrk for d with l7GateConns keep-alive connections
// from the client namespace, pinned to the client's CPU; script, when
// set, is a Lua script that writes the requests.
func wrkKeepAlive(ctx context.Context, ns, url string, d time.Duration, script string) (wrkRun, error) {
	args := []string{"wrk", "-t1", "-c" + strconv.Itoa(l7GateConns), "-d" + strconv.Itoa(int(math.Ceil(d.Seconds()))) + "s", "--latency", "--timeout", "5s"}
	if script != "" {
		args = append(args, "-s", script)
	}
	args = append(args, url)
	out, err := inNS(ctx, ns, clientCPU, args...).CombinedOutput()
	if err != nil {
		return wrkRun{}, fmt.Errorf("wrk: %w: %s", err, out)
	}
	var w wrkRun
	m := wrkRPS.FindSubmatch(out)
	if m == nil {
		return w, fmt.Errorf("no Requests/sec in wrk's output: %s", out)
	}
	w.rps, _ = strconv.ParseFloat(string(m[1]), 64)
	for _, p := range wrkLatencyPct.FindAllSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(string(p[2]), 64)
		v *= map[string]float64{"us": 0.001, "ms": 1, "s": 1000}[string(p[3])]
		if string(p[1]) == "50" {
			w.p50 = v
		} else {
			w.p99 = v
		}
	}
	if e := wrkErrors.FindSubmatch(out); e != nil {
		for _, n := range e[1:] {
			k, _ := strconv.Atoi(string(n))
			w.errors += float64(k)
		}
	}
	if e := wrkNon2xx.FindSubmatch(out); e != nil {
		k, _ := strconv.Atoi(string(e[1]))
		w.errors += float64(k)
	}
	return w, nil
}

// h2load's summary lines: the rate, the requests that did not complete,
// and the statuses.
var (
	h2loadRPS      = regexp.MustCompile(`finished in [0-9.]+m?s, ([0-9.]+) req/s`)
	h2loadFailed   = regexp.MustCompile(`requests: \d+ total, \d+ started, \d+ done, \d+ succeeded, (\d+) failed, (\d+) errored, (\d+) timeout`)
	h2loadStatuses = regexp.MustCompile(`status codes: \d+ 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx`)
)

// h2loadRun loads url over HTTP/2 with prior knowledge (h2c) from
// namespace ns for d: as many connections as wrk keeps, one stream at a
// time on each, as wrk's HTTP/1.1 requests are. Errors count requests
// that failed, errored or timed out and answers other than 2xx. h2load
// reports no latency percentiles: p50 and p99 are NaN.
func h2loadRun(ctx context.Context, ns, url string, d time.Duration) (wrkRun, error) {
	secs := strconv.Itoa(int(math.Ceil(d.Seconds())))
	out, err := inNS(ctx, ns, clientCPU, "h2load", "-t1", "-c"+strconv.Itoa(l7GateConns), "-m1", "-D"+secs, url).CombinedOutput()
	if err != nil {
		return wrkRun{}, fmt.Errorf("h2load (apt-get install nghttp2-client): %w: %s", err, out)
	}
	w := wrkRun{p50: math.NaN(), p99: math.NaN()}
	m := h2loadRPS.FindSubmatch(out)
	if m == nil {
		return w, fmt.Errorf("no req/s in h2load's output: %s", out)
	}
	w.rps, _ = strconv.ParseFloat(string(m[1]), 64)
	for _, re := range []*regexp.Regexp{h2loadFailed, h2loadStatuses} {
		e := re.FindSubmatch(out)
		if e == nil {
			return w, fmt.Errorf("h2load's output has no %q line: %s", re, out)
		}
		for _, n := range e[1:] {
			k, _ := strconv.Atoi(string(n))
			w.errors += float64(k)
		}
	}
	return w, nil
}

// l7GateCgroup makes a cgroup below the machine's cgroup v2 root for the
// server, and a release that removes it (and a cgroup2 mount it made).
func l7GateCgroup() (string, func() error, error) {
	dir, err := os.MkdirTemp("", "weir-l7gate-")
	if err != nil {
		return "", nil, err
	}
	root := filepath.Join(dir, "cgroup2")
	mounted, err := datapath.MountCgroup2(root)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	cg := filepath.Join(root, "server")
	if err := os.Mkdir(cg, 0o755); err != nil {
		return "", nil, err
	}
	return cg, func() error {
		var errs []error
		for i := 0; ; i++ { // empty a moment after the server is reaped
			err := os.Remove(cg)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if i == 100 {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", cg, err))
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if mounted {
			errs = append(errs, unix.Unmount(root, unix.MNT_DETACH))
		}
		return errors.Join(append(errs, os.RemoveAll(dir))...)
	}, nil
}

// judgeL7Gate: each pass-everything path must keep l7GateWant of the
// plain port's requests/s, paired within each repetition.
func (r *result) judgeL7Gate() {
	for _, t := range []struct {
		setup string
		want  float64
	}{{l7GateStrp, l7GateWant}, {l7GateSkb, l7GateWant}, {l7GateHTTP1, l7WantOneRule}, {l7GateHTTP40, l7WantFortyRules},
		{l7GateHTTPRegex, l7WantOneRule}, {l7GateUser, l7WantOneRule}, {l7GateTiers, l7WantOneRule}, {l7GateHTTP1New, l7WantOneRule},
		{l7GateH2One, l7WantOneRule}} {
		if math.IsNaN(r.median(t.setup, l7GatePath, "rps")) {
			continue // a result from before the setup existed
		}
		base := l7GateBaseline(t.setup)
		r.Targets = append(r.Targets, r.pairedTarget(
			fmt.Sprintf("requests/s at %d keep-alive connections, %s / %s", l7GateConns, t.setup, base),
			fmt.Sprintf(">= %.2f", t.want), func(v float64) bool { return v >= t.want },
			t.setup, l7GatePath, base, l7GatePath, "rps"))
	}
	for _, s := range []string{l7GateHTTP1, l7GateHTTP40} {
		if math.IsNaN(r.median(s, l7GateRatePath, "p99_ms")) {
			continue // a result from before the constant-rate runs
		}
		r.Targets = append(r.Targets, r.pairedTarget(
			fmt.Sprintf("p99 latency at half no policy's requests/s, %s / %s", s, l7GatePlain),
			fmt.Sprintf("<= %.2f", l7WantRateP99), func(v float64) bool { return v <= l7WantRateP99 },
			s, l7GateRatePath, l7GatePlain, l7GateRatePath, "p99_ms"))
	}
	for _, s := range l7GateRateSetups {
		if got := r.median(s, l7GateRatePath, "errors"); !math.IsNaN(got) {
			r.Targets = append(r.Targets, target{What: fmt.Sprintf("calls without a 200 at the constant rate, %s (median per run)", s),
				Want: "0", Got: got, Met: got == 0})
		}
	}
}

// l7GateMarkdown is the report: every setup's medians, the paired ratios
// to the plain port, the gate.
func (r *result) l7GateMarkdown() string {
	var b strings.Builder
	r.writeHeader(&b)
	fmt.Fprintf(&b, "nginx (one worker, CPU 1, a fixed 3-byte body) in one network namespace, wrk (one thread, %d keep-alive connections, CPU 0) in another, over a veth pair; "+
		"one nginx listens on a port per setup: one left alone, one whose accepted sockets join bpf/l7.c's strparser socket hash and one its skb-verdict hash, "+
		"both verdicts passing everything, and two its HTTP hash, whose verdict reads every request in the kernel and judges it against a set of 1 or of 40 HTTP rules "+
		"(wrk's GET / matches the last; every request judged and allowed is checked), one whose single rule's path is a regular expression, judged in the kernel by the set's automaton, "+
		"and one whose single rule has a Host header's regular expression, which the kernel leaves to user space: "+
		"each connection is handed to the proxy (internal/proxy, in the bench process, one slot per connection) at its first request, and the proxy judges and forwards every request after (each allowed request counted); "+
		"and one whose rule is a WeirClusterNetworkPolicy's (an Admin Accept of GET / with an HTTP rule, before a Deny of all), whose flows the kernel hands to the proxy at their first request, which judges every request against the compiled policy, walking the precedence order. "+
		"The two h2c setups serve HTTP/2 over cleartext (gRPC's transport) on ports of their own, h2load (nghttp2, one thread, the same number of connections, one stream at a time each, CPU 0) sending GET /: "+
		"one port left alone, and one with 1 HTTP rule, whose connections the kernel hands whole to the proxy at their preface, which ends HTTP/2 on both sides and judges every request (h2load reports no latency percentiles). "+
		"The two new-paths setups send every request to a path of its own (wrk's Lua script GET /item/<n>), so on the HTTP port each request is a record of its own, "+
		"drained as it comes through the agent's record path (explained and counted into a flow store) by the bench process; on the others, the repeated GET / is one record a second per connection. "+
		"%d repetitions of %gs, the setups in a rotating order%s. Cells: median (median of the per-repetition ratios to no policy with the same requests).\n\n",
		l7GateConns, r.Reps, r.DurationS, r.warmupNote())
	var setups []string
	for _, s := range l7GateSetups {
		if !math.IsNaN(r.median(s, l7GatePath, "rps")) {
			setups = append(setups, s)
		}
	}
	fmt.Fprintf(&b, "| metric | %s |\n|---|%s\n", strings.Join(setups, " | "), strings.Repeat("---|", len(setups)))
	for _, m := range []struct{ key, title, format string }{
		{"rps", "requests/s", "%.0f"}, {"p50_ms", "latency p50 (ms)", "%.3f"}, {"p99_ms", "latency p99 (ms)", "%.3f"},
		{"errors", "errors (socket errors and non-2xx, per run)", "%.0f"}, {"sockets_joined", "sockets that joined a socket hash (per run)", "%.0f"},
		{"requests_judged", "requests read and allowed in the kernel (per run)", "%.0f"},
		{"records", "request records read by the agent's record path (per run)", "%.0f"},
		{"records_lost", "request records lost to a full ring (per run)", "%.0f"},
		{"requests_proxied", "requests allowed by the user-space proxy (per run)", "%.0f"},
	} {
		fmt.Fprintf(&b, "| %s |", m.title)
		for _, s := range setups {
			cell := fmt.Sprintf(" "+m.format, r.median(s, l7GatePath, m.key))
			if base := l7GateBaseline(s); s != base && (m.key == "rps" || strings.HasSuffix(m.key, "_ms")) {
				cell += fmt.Sprintf(" (%.3f)", r.pairedRatio(s, l7GatePath, base, l7GatePath, m.key))
			}
			b.WriteString(cell + " |")
		}
		b.WriteString("\n")
	}
	r.writeRateTable(&b)
	r.writeTargets(&b)
	return b.String()
}

// writeRateTable is the constant-rate runs' table, when the result has
// them.
func (r *result) writeRateTable(b *strings.Builder) {
	var setups []string
	for _, s := range l7GateRateSetups {
		if !math.IsNaN(r.median(s, l7GateRatePath, "p99_ms")) {
			setups = append(setups, s)
		}
	}
	if len(setups) == 0 {
		return
	}
	fmt.Fprintf(b, "\n## At a constant rate\n\nfortio's periodic runner (fortio.org/fortio, in the bench binary, CPU 0) sends GET / over the same %d keep-alive connections "+
		"at half the plain port's requests/s of the same repetition, for as long as a wrk run; a connection behind its schedule sends at once to catch up, "+
		"so the rate got says whether the setup kept up. Latency: each call's start to its answer's end. "+
		"Cells: median (median of the per-repetition ratios to no policy).\n\n", l7GateConns)
	fmt.Fprintf(b, "| metric | %s |\n|---|%s\n", strings.Join(setups, " | "), strings.Repeat("---|", len(setups)))
	for _, m := range []struct{ key, title, format string }{
		{"rate_asked", "rate asked (req/s)", "%.0f"}, {"rate_got", "rate got (req/s)", "%.0f"},
		{"p50_ms", "latency p50 (ms)", "%.3f"}, {"p90_ms", "latency p90 (ms)", "%.3f"}, {"p99_ms", "latency p99 (ms)", "%.3f"},
		{"p999_ms", "latency p99.9 (ms)", "%.3f"}, {"errors", "calls without a 200 (per run)", "%.0f"},
	} {
		fmt.Fprintf(b, "| %s |", m.title)
		for _, s := range setups {
			cell := fmt.Sprintf(" "+m.format, r.median(s, l7GateRatePath, m.key))
			if s != l7GatePlain && strings.HasSuffix(m.key, "_ms") {
				cell += fmt.Sprintf(" (%.3f)", r.pairedRatio(s, l7GateRatePath, l7GatePlain, l7GateRatePath, m.key))
			}
			b.WriteString(cell + " |")
		}
		b.WriteString("\n")
	}
}

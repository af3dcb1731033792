package agent

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/policy"
	"github.com/weirnet/weir/internal/proxy"
)

// l7ProxySlots is how many connections the node's proxy judges at once;
// a connection the kernel hands over while all are busy is closed (and
// reset), as before the proxy existed.
const l7ProxySlots = 256

// startL7Proxy runs the proxy that judges, in user space, the HTTP
// connections the kernel hands over (internal/proxy), until ctx ends.
// Its records go to record, as the kernel's do.
func (a *Agent) startL7Proxy(ctx context.Context, node *datapath.Node, record func(datapath.L7Event)) error {
	opener, err := node.L7Proxy()
	if err != nil {
		return err
	}
	if err := opener.Reset(); err != nil {
		return err
	}
	judge := &proxy.TierJudge{Sets: proxy.NewSetJudge(node.HTTPMatcher), Policy: a.policyView}
	px := proxy.New(judge, opener, func(r proxy.Record) { record(proxyEvent(r)) }, a.log)
	if err := px.Start(l7ProxySlots); err != nil {
		px.Close()
		opener.Close()
		return fmt.Errorf("start the L7 proxy: %w", err)
	}
	a.metrics.proxy.Store(px)
	go func() {
		<-ctx.Done()
		a.metrics.proxy.Store(nil)
		px.Close()
		opener.Close()
	}()
	return nil
}

// policyView is the policy loaded now and the local endpoint an address
// is, for the proxy's judge of flows with conditional cluster rules.
func (a *Agent) policyView(local netip.Addr) (*policy.Result, string, bool) {
	n := a.flowNames.Load()
	if n == nil || n.policy == nil {
		return nil, "", false
	}
	pod, ok := n.byIP[local]
	return n.policy, pod, ok
}

// proxyEvent is a proxy's record as the kernel's request records are.
func proxyEvent(r proxy.Record) datapath.L7Event {
	ev := datapath.L7Event{
		Time: time.Now(), Cookie: r.Handoff.Cookie, Client: r.Handoff.Client, Server: r.Handoff.Server,
		Sets: r.Sets, Set: r.Decision.Set, Rule: r.Decision.Rule, Policy: r.Decision.Policy, Count: 1,
		Answered: r.Answered, Closed: r.Ended, Proxied: true, Egress: r.Handoff.Egress,
	}
	switch {
	case r.Err != nil:
		ev.Verdict = datapath.L7Refused
		ev.ProxyReason = r.Err.Reason
	case r.Decision.Verdict == proxy.Allow:
		ev.Verdict = datapath.L7Allowed
	case r.Decision.Verdict == proxy.Refuse:
		ev.Verdict = datapath.L7Refused
		ev.ProxyReason = "a header a rule names appears more than once"
	default:
		ev.Verdict = datapath.L7Denied
		ev.Pipelined = !r.Answered
	}
	// An HTTP/2 request's own answer, which passed the proxy.
	ev.Status, ev.Latency, ev.LatencyMax = r.Status, r.Latency, r.Latency
	if q := r.Request; q != nil {
		line := q.Method + " " + q.Target + " " + q.Proto
		if len(line) > 128 {
			line, ev.LineCut = line[:128], true
		}
		ev.Line, ev.Host = []byte(line), q.Host
	}
	return ev
}

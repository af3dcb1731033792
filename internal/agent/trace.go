package agent

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/policy"
)

// ErrNotLocal is returned by Trace when neither end of the flow is a pod
// of this node: another node's agent has to answer.
var ErrNotLocal = errors.New("no end of the flow is on this node")

// tracer is the part of the datapath that runs synthetic packets;
// *datapath.Node implements it.
type tracer interface {
	Trace(datapath.TracePacket) (datapath.TraceResult, error)
}

// serveTrace answers GET /v1/trace?src=&dst=&proto=&port=.
func (a *Agent) serveTrace(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	q := api.TraceQuery{Src: v.Get("src"), Dst: v.Get("dst"), Proto: v.Get("proto")}
	if p := v.Get("port"); p != "" {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil {
			writeError(w, api.Errorf(api.CodeDecodeFailure, "invalid port", err))
			return
		}
		q.Port = uint16(n)
	}
	if v.Has("method") || v.Has("path") || v.Has("host") || v.Has("header") {
		q.HTTP = &api.TraceRequest{Method: v.Get("method"), Path: v.Get("path"), Host: v.Get("host"), Headers: v["header"]}
	}
	t, err := a.Trace(q)
	if err != nil {
		var e *api.Error
		switch {
		case errors.As(err, &e):
		case errors.Is(err, ErrNotLocal):
			writeJSON(w, http.StatusNotFound, api.Errorf(api.CodeTraceNotLocal, "trace", err))
			return
		default:
			err = api.Errorf(api.CodeDatapath, "trace", err)
		}
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

// traceProto parses tcp, udp or icmp and checks the port goes with it.
func traceProto(name string, port uint16) (uint8, error) {
	switch strings.ToLower(name) {
	case "tcp", "udp":
		if port == 0 {
			return 0, fmt.Errorf("%s needs a port from 1 to 65535", name)
		}
		if strings.EqualFold(name, "tcp") {
			return 6, nil
		}
		return 17, nil
	case "icmp":
		if port != 0 {
			return 0, errors.New("icmp has no port")
		}
		return 1, nil
	}
	return 0, fmt.Errorf("protocol %q: want tcp, udp or icmp", name)
}

// traceTarget is one end of a traced flow.
type traceTarget struct {
	peer    api.TracePeer
	addr    netip.Addr
	ifindex int // host veth when the pod is local and enforced on
}

// Trace explains q at the ends of the flow local to this node from the
// loaded policy, and runs the flow's first packet through the datapath's
// trace instance to confirm it.
func (a *Agent) Trace(q api.TraceQuery) (*api.Trace, error) {
	proto, err := traceProto(q.Proto, q.Port)
	if err != nil {
		return nil, api.Errorf(api.CodeDecodeFailure, "invalid trace query", err)
	}
	if q.HTTP != nil {
		if proto != 6 {
			return nil, api.Errorf(api.CodeDecodeFailure, "invalid trace query", fmt.Errorf("an HTTP request needs tcp, not %s: %w", q.Proto, errTraceRequest))
		}
		if _, err := traceRequestHead(q.HTTP); err != nil {
			return nil, api.Errorf(api.CodeDecodeFailure, "invalid trace query", err)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	res := a.policy.loaded
	if res == nil {
		return nil, api.Errorf(api.CodeTryAgainLater, "no policy loaded yet", nil)
	}
	src, err := a.resolveTargetLocked(q.Src)
	if err != nil {
		return nil, err
	}
	dst, err := a.resolveTargetLocked(q.Dst)
	if err != nil {
		return nil, err
	}
	if src.ifindex == 0 && dst.ifindex == 0 {
		return nil, fmt.Errorf("%w (%s): source %s is on %s, destination %s is on %s", ErrNotLocal, a.cfg.NodeName,
			describe(src.peer), nodeOf(src.peer), describe(dst.peer), nodeOf(dst.peer))
	}
	t := &api.Trace{Node: a.cfg.NodeName, Src: src.peer, Dst: dst.peer, Proto: strings.ToLower(q.Proto), Port: q.Port}
	type judged struct {
		ifindex int
		dir     policy.Direction
		d       policy.Decision
	}
	var ends []judged
	if src.ifindex != 0 {
		end, d := explainEnd(res, src.peer.Pod, policy.Egress, dst.addr, proto, q.Port)
		t.Ends, ends = append(t.Ends, end), append(ends, judged{src.ifindex, policy.Egress, d})
	}
	if dst.ifindex != 0 {
		end, d := explainEnd(res, dst.peer.Pod, policy.Ingress, src.addr, proto, q.Port)
		t.Ends, ends = append(t.Ends, end), append(ends, judged{dst.ifindex, policy.Ingress, d})
	}
	decisive := ends[0].d
	for _, e := range ends {
		if decisive = e.d; !e.d.Allowed() {
			break
		}
	}
	t.Verdict = decisive.Verdict.String()
	if q.HTTP != nil {
		if dst.ifindex == 0 {
			t.HTTP = &api.TraceHTTP{Note: "the server's HTTP rules are judged at its node: ask " + nodeOf(dst.peer)}
		} else if t.HTTP, err = traceHTTP(res, dst.peer.Pod, policy.Ingress, src.addr, q.Port, q.HTTP); err != nil {
			return nil, api.Errorf(api.CodeDecodeFailure, "invalid trace query", err)
		}
		if src.ifindex != 0 {
			if t.EgressHTTP, err = traceHTTP(res, src.peer.Pod, policy.Egress, dst.addr, q.Port, q.HTTP); err != nil {
				return nil, api.Errorf(api.CodeDecodeFailure, "invalid trace query", err)
			}
		}
	}

	tr, ok := a.dp.(tracer)
	if !ok {
		return nil, api.Errorf(api.CodeDatapath, "this datapath cannot run trace packets", nil)
	}
	run, err := tr.Trace(datapath.TracePacket{Src: src.addr, Dst: dst.addr, Proto: proto, Port: q.Port,
		SrcIfindex: src.ifindex, DstIfindex: dst.ifindex})
	if err != nil {
		return nil, api.Errorf(api.CodeDatapath, "run trace packet", err)
	}
	t.Program, t.TCVerdict = run.Program, run.TCVerdict
	t.Agree = tcAgrees(decisive.Verdict, run.TCVerdict)
	blocked := false // an earlier end dropped the packet
	for i, e := range ends {
		end := &t.Ends[i]
		for _, ev := range run.Events {
			if ev.Ifindex == e.ifindex && ev.Direction == e.dir {
				got := traceDecision(res, policy.Decision{Verdict: ev.Verdict, Stage: ev.Stage, Rule: ev.Rule, Log: ev.Log, Passed: ev.Passed})
				end.Datapath = &got
				break
			}
		}
		if end.Datapath == nil {
			end.Agree = blocked
		} else {
			end.Agree = !blocked && *end.Datapath == end.Compiled
		}
		t.Agree = t.Agree && end.Agree
		blocked = blocked || !e.d.Allowed()
	}
	return t, nil
}

// tcAgrees reports whether the program's return fits the flow's verdict:
// a denied packet is dropped, an allowed one goes on, a rejected one is
// dropped or answered.
func tcAgrees(v policy.Verdict, tc string) bool {
	switch v {
	case policy.VerdictDeny:
		return tc == "shot"
	case policy.VerdictReject:
		return tc != "ok"
	}
	return tc != "shot"
}

// resolveTargetLocked finds s, a pod namespace/name or an address, among
// this node's leases and, with Kubernetes, the cluster's pods.
func (a *Agent) resolveTargetLocked(s string) (traceTarget, error) {
	var t traceTarget
	addr, err := netip.ParseAddr(s)
	isAddr := err == nil
	if isAddr {
		t.addr, t.peer.IP = addr, addr.String()
	}
	matches := func(key string, ips []netip.Addr) bool {
		if !isAddr {
			return key == s
		}
		for _, ip := range ips {
			if ip == addr {
				return true
			}
		}
		return false
	}
	for _, l := range a.ipam.List() {
		key := l.PodNamespace + "/" + l.PodName
		if l.PodName == "" || !matches(key, []netip.Addr{l.Addr}) || !l.Addr.Is4() {
			continue
		}
		t.peer = api.TracePeer{Pod: key, IP: l.Addr.String(), Node: a.cfg.NodeName, Local: true}
		t.addr = l.Addr
		if ep, ok := a.policy.endpoints[key]; ok {
			t.ifindex = ep.Ifindex
		}
		return t, nil
	}
	if a.snapshot != nil {
		if snap, ok := a.snapshot(); ok {
			for _, p := range snap.ClusterPods {
				if p.Terminal || !matches(p.Key(), p.IPs) {
					continue
				}
				t.peer.Pod, t.peer.Node = p.Key(), p.NodeName
				if !isAddr {
					for _, ip := range p.IPs {
						if ip.Is4() {
							t.addr, t.peer.IP = ip, ip.String()
							break
						}
					}
				}
				if !t.addr.IsValid() {
					return t, api.Errorf(api.CodeUnknownContainer, fmt.Sprintf("pod %s has no IPv4 address yet", s), nil)
				}
				return t, nil
			}
		}
	}
	if !isAddr {
		return t, api.Errorf(api.CodeUnknownContainer, fmt.Sprintf("pod %s not found (want namespace/name or an IP address)", s), nil)
	}
	if addr == a.cfg.NodeIP {
		t.peer.Node = a.cfg.NodeName
	}
	return t, nil
}

func describe(p api.TracePeer) string {
	if p.Pod != "" {
		return p.Pod + " (" + p.IP + ")"
	}
	return p.IP
}

func nodeOf(p api.TracePeer) string {
	if p.Node == "" {
		return "no node this agent knows"
	}
	return "node " + p.Node
}

// explainEnd is the compiled decision at one local end and how it came.
func explainEnd(res *policy.Result, pod string, dir policy.Direction, peer netip.Addr, proto uint8, port uint16) (api.TraceEnd, policy.Decision) {
	d := res.Lookup(pod, dir, peer, proto, port)
	label, cidr := res.PeerIdentities(peer)
	end := api.TraceEnd{Pod: pod, Direction: dir.String(), PeerIdentity: identityName(label),
		PeerCIDRIdentity: identityName(cidr), Compiled: traceDecision(res, d)}
	if ep, ok := res.Endpoints[pod]; ok {
		end.Enforced, end.Tiered = ep.Enforced[dir], ep.Tiered[dir]
		end.Policies = append([]string(nil), ep.Policies[dir]...)
	}
	end.Steps = precedenceSteps(res, end.Enforced, end.Tiered, d)
	return end, d
}

func identityName(id policy.Identity) string {
	if n := policy.ReservedName(id); n != "" {
		return n
	}
	return strconv.FormatUint(uint64(id), 10)
}

func traceDecision(res *policy.Result, d policy.Decision) api.TraceDecision {
	out := api.TraceDecision{Verdict: d.Verdict.String(), Stage: d.Stage.String(),
		Rule: uint32(d.Rule), Log: uint32(d.Log), Passed: uint32(d.Passed)}
	out.RuleName, out.LogName, out.PassedName = traceRuleName(res, d.Rule), traceRuleName(res, d.Log), traceRuleName(res, d.Passed)
	return out
}

func traceRuleName(res *policy.Result, id policy.RuleID) string {
	if id == 0 {
		return ""
	}
	if r, ok := res.Rules[id]; ok {
		return r.String()
	}
	return fmt.Sprintf("rule %d (not in the loaded policy)", id)
}

// precedenceSteps walks decide.go's order (Admin tier, NetworkPolicy,
// Baseline tier, default) and says what each step found, up to the one
// that decided.
func precedenceSteps(res *policy.Result, enforced, tiered bool, d policy.Decision) []string {
	if d.Stage == policy.StageUnenforced {
		return []string{"no policy selects the pod in this direction: allowed"}
	}
	passedIn := func(t policy.Tier) bool { r, ok := res.Rules[d.Passed]; return d.Passed != 0 && ok && r.Tier == t }
	tierStep := func(name string, t policy.Tier, stage policy.Stage) string {
		switch {
		case !tiered:
			return name + ": no cluster policy selects the pod"
		case d.Stage == stage:
			return fmt.Sprintf("%s: %s by %s", name, d.Verdict, traceRuleName(res, d.Rule))
		case passedIn(t):
			return fmt.Sprintf("%s: passed on by %s", name, traceRuleName(res, d.Passed))
		}
		return name + ": no rule matches"
	}
	steps := []string{tierStep("1. Admin tier", policy.TierAdmin, policy.StageAdmin)}
	if d.Stage == policy.StageAdmin {
		return steps
	}
	switch {
	case d.Stage == policy.StageNetworkPolicy:
		return append(steps, "2. NetworkPolicy: allowed by "+traceRuleName(res, d.Rule))
	case d.Stage == policy.StageNetworkPolicyDefaultDeny:
		return append(steps, "2. NetworkPolicy: selects the pod and no rule allows: denied")
	case !enforced:
		steps = append(steps, "2. NetworkPolicy: none selects the pod")
	}
	steps = append(steps, tierStep("3. Baseline tier", policy.TierBaseline, policy.StageBaseline))
	if d.Stage == policy.StageBaseline {
		return steps
	}
	return append(steps, "4. default: allowed")
}

package connectivity

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/k8s"
)

// What a check wants of its connection.
const (
	WantAnswered = "answered"
	WantDenied   = "denied"  // dropped (a timeout) or refused at once
	WantRefused  = "refused" // refused at once, not left to time out
)

// The phases of a run: what is in force while its checks run.
const (
	PhaseNoPolicy      = "no policy"
	PhaseNetworkPolicy = "NetworkPolicy"
	PhaseClusterPolicy = "ClusterNetworkPolicy"
	PhaseEgress        = "NetworkPolicy egress"
)

// Probe kinds: how the client tries.
const (
	kindHTTP    = "tcp"     // one HTTP request over TCP to a probe server
	kindConnect = "connect" // a TCP handshake with anything
	kindUDP     = "udp"     // a datagram to a probe server, its answer back
	kindDNS     = "dns"     // a lookup through the pod's resolver
)

// probe is one check to make.
type probe struct {
	name, phase string
	from        string // the client pod
	kind        string
	target      string // host:port, or a name for kindDNS
	to          string // the target as the report shows it
	want        string
	// wantPod, when set, must be the pod that answered.
	wantPod string
	// The flows that record the verdict: the agent of ruleNode, for the
	// pod rulePod (namespace/name) and destination port rulePort.
	ruleNode string
	rulePod  string
	rulePort int
	// ruleEgress: the verdict is rulePod's egress (it is the client),
	// not its ingress.
	ruleEgress bool
	// wantStage and wantPolicy, when set, must be the stage and the
	// policy (kind/name) of the newest flow recording a denial.
	wantStage, wantPolicy string
	// skip, when set, is why the check cannot run here.
	skip string
}

// Check is one check's result.
type Check struct {
	Name  string `json:"name"`
	Phase string `json:"phase"`
	From  string `json:"from"`
	To    string `json:"to"`
	Want  string `json:"want"`
	// Got is the outcome: answered, refused, timeout, unresolved, error.
	Got  string `json:"got,omitempty"`
	Pass bool   `json:"pass"`
	// Skipped says why the check did not run.
	Skipped string `json:"skipped,omitempty"`
	// Rule is the deciding rule as the judging agent's flows record it.
	Rule string `json:"rule,omitempty"`
	// Detail is what failed, or who answered.
	Detail string  `json:"detail,omitempty"`
	Millis float64 `json:"ms,omitempty"`
	// Tries: attempts until the outcome held (a policy takes effect).
	Tries int `json:"tries,omitempty"`
}

// env is what the probes are built from: the deployed pods and Service.
type env struct {
	ns       string
	a, b     string // nodes: the clients' and server-remote's
	pods     map[string]*corev1.Pod
	svc      *corev1.Service
	nodeIP   map[string]string // node name -> InternalIP
	external string            // host:port outside the cluster, or empty
	// noEndpoints is a Service without a backend.
	noEndpoints *corev1.Service
}

func (e *env) podIP(name string) string { return e.pods[name].Status.PodIP }

func (e *env) podAddr(name string, port int) string {
	return net.JoinHostPort(e.podIP(name), strconv.Itoa(port))
}

func (e *env) qualified(name string) string { return e.ns + "/" + name }

// baseProbes are the checks with no policy in force.
func (e *env) baseProbes() []probe {
	otherNode := ""
	if e.b == "" {
		otherNode = "the cluster has one schedulable node"
	}
	clusterIP := e.svc.Spec.ClusterIP
	remote := e.pods[podServerRemote].Spec.NodeName
	out := []probe{
		{name: "pod to pod, same node, TCP", from: podClient, kind: kindHTTP, target: e.podAddr(podServerLocal, probeTCPPort),
			wantPod: podServerLocal, ruleNode: e.a, rulePod: e.qualified(podServerLocal), rulePort: probeTCPPort},
		{name: "pod to pod, other node, TCP", from: podClient, kind: kindHTTP, target: e.podAddr(podServerRemote, probeTCPPort),
			wantPod: podServerRemote, ruleNode: remote, rulePod: e.qualified(podServerRemote), rulePort: probeTCPPort, skip: otherNode},
		{name: "pod to pod, other node, UDP", from: podClient, kind: kindUDP, target: e.podAddr(podServerRemote, probeUDPPort),
			wantPod: podServerRemote, ruleNode: remote, rulePod: e.qualified(podServerRemote), rulePort: probeUDPPort, skip: otherNode},
		{name: "pod to Service, ClusterIP, TCP", from: podClient, kind: kindHTTP, target: net.JoinHostPort(clusterIP, strconv.Itoa(serviceTCPPort)),
			wantPod: podServerRemote, ruleNode: remote, rulePod: e.qualified(podServerRemote), rulePort: probeTCPPort},
		{name: "pod to Service, ClusterIP, UDP", from: podClient, kind: kindUDP, target: net.JoinHostPort(clusterIP, strconv.Itoa(serviceUDPPort)),
			wantPod: podServerRemote, ruleNode: remote, rulePod: e.qualified(podServerRemote), rulePort: probeUDPPort},
		{name: "pod to Service, DNS name, TCP", from: podClient, kind: kindHTTP,
			target:  net.JoinHostPort(serviceName+"."+e.ns+".svc", strconv.Itoa(serviceTCPPort)),
			wantPod: podServerRemote, ruleNode: remote, rulePod: e.qualified(podServerRemote), rulePort: probeTCPPort},
		{name: "DNS, the API server's Service name", from: podClient, kind: kindDNS, target: "kubernetes.default.svc"},
		{name: "node to pod, same node", from: podHostClient, kind: kindHTTP, target: e.podAddr(podServerLocal, probeTCPPort),
			wantPod: podServerLocal, ruleNode: e.a, rulePod: e.qualified(podServerLocal), rulePort: probeTCPPort},
		{name: "node to pod, other node", from: podHostClient, kind: kindHTTP, target: e.podAddr(podServerRemote, probeTCPPort),
			wantPod: podServerRemote, ruleNode: remote, rulePod: e.qualified(podServerRemote), rulePort: probeTCPPort, skip: otherNode},
	}
	// A pod reaches its own and another node at the kubelet's port.
	for _, n := range []struct{ label, node, skip string }{{"same node", e.a, ""}, {"other node", e.b, otherNode}} {
		ip := e.nodeIP[n.node]
		skip := n.skip
		if skip == "" && ip == "" {
			skip = "the node has no InternalIP"
		}
		out = append(out, probe{name: "pod to node, " + n.label + " (kubelet port)", from: podClient, kind: kindConnect,
			target: net.JoinHostPort(ip, "10250"), to: "node " + n.node + " " + net.JoinHostPort(ip, "10250"), skip: skip})
	}
	out = append(out, e.nodePortProbes(otherNode)...)
	out = append(out, probe{name: "pod to a Service without endpoints: refused at once", from: podClient, kind: kindHTTP,
		target: net.JoinHostPort(e.noEndpoints.Spec.ClusterIP, strconv.Itoa(serviceTCPPort)), want: WantRefused,
		to: e.ns + "/" + serviceNoEndpoints + " " + net.JoinHostPort(e.noEndpoints.Spec.ClusterIP, strconv.Itoa(serviceTCPPort))})
	ext := probe{name: "pod to outside the cluster", from: podClient, kind: kindConnect, target: e.external, to: e.external}
	if e.external == "" {
		ext.to, ext.skip = "-", "no --external-target given (host:port of something outside the cluster that accepts TCP)"
	}
	out = append(out, ext)
	for i := range out {
		out[i].phase = PhaseNoPolicy
		if out[i].want == "" {
			out[i].want = WantAnswered
		}
	}
	return out
}

// nodePortProbes reach server-remote through the Service's NodePort: from
// a pod at the other node's address, and from the node at its own.
func (e *env) nodePortProbes(otherNode string) []probe {
	port := strconv.Itoa(int(e.svc.Spec.Ports[0].NodePort))
	at := func(node string) string { return net.JoinHostPort(e.nodeIP[node], port) }
	noIP := func(node, skip string) string {
		if skip == "" && e.nodeIP[node] == "" {
			return "the node has no InternalIP"
		}
		return skip
	}
	return []probe{
		{name: "pod to NodePort, other node, TCP", from: podClient, kind: kindHTTP, target: at(e.b), wantPod: podServerRemote,
			to: "node " + e.b + " " + at(e.b), skip: noIP(e.b, otherNode)},
		{name: "node to NodePort, same node, TCP", from: podHostClient, kind: kindHTTP, target: at(e.a), wantPod: podServerRemote,
			to: "node " + e.a + " " + at(e.a), skip: noIP(e.a, "")},
	}
}

// egressProbes run while egressPolicy is in force too: the client may
// reach server-local's TCP port and nothing else.
func (e *env) egressProbes() []probe {
	np := "NetworkPolicy/" + egressPolicy(e.ns).Name
	client := e.qualified(podClient)
	return inPhase(PhaseEgress, []probe{
		{name: "NetworkPolicy egress stops what it does not allow, at the client's node", from: podClient, kind: kindUDP,
			target: e.podAddr(podServerLocal, probeUDPPort), want: WantDenied,
			ruleNode: e.a, rulePod: client, rulePort: probeUDPPort, ruleEgress: true, wantStage: "networkpolicy-default-deny"},
		{name: "NetworkPolicy egress allows what it names", from: podClient, kind: kindHTTP,
			target: e.podAddr(podServerLocal, probeTCPPort), want: WantAnswered, wantPod: podServerLocal,
			ruleNode: e.a, rulePod: client, rulePort: probeTCPPort, ruleEgress: true, wantPolicy: np},
	})
}

// networkPolicyProbes run while networkPolicy is in force: only the
// granted client reaches server-remote; server-local, which it does not
// select, still answers everyone.
func (e *env) networkPolicyProbes() []probe {
	remote := e.pods[podServerRemote].Spec.NodeName
	np := "NetworkPolicy/" + networkPolicy(e.ns).Name
	return inPhase(PhaseNetworkPolicy, []probe{
		{name: "NetworkPolicy denies a client it does not admit (TCP)", from: podClient, kind: kindHTTP,
			target: e.podAddr(podServerRemote, probeTCPPort), want: WantDenied,
			ruleNode: remote, rulePod: e.qualified(podServerRemote), rulePort: probeTCPPort, wantStage: "networkpolicy-default-deny"},
		{name: "NetworkPolicy denies a client it does not admit (UDP)", from: podClient, kind: kindUDP,
			target: e.podAddr(podServerRemote, probeUDPPort), want: WantDenied,
			ruleNode: remote, rulePod: e.qualified(podServerRemote), rulePort: probeUDPPort, wantStage: "networkpolicy-default-deny"},
		{name: "NetworkPolicy denies through the Service too", from: podClient, kind: kindHTTP,
			target: net.JoinHostPort(e.svc.Spec.ClusterIP, strconv.Itoa(serviceTCPPort)), want: WantDenied,
			ruleNode: remote, rulePod: e.qualified(podServerRemote), rulePort: probeTCPPort, wantStage: "networkpolicy-default-deny"},
		{name: "NetworkPolicy admits the client it allows", from: podClientGranted, kind: kindHTTP,
			target: e.podAddr(podServerRemote, probeTCPPort), want: WantAnswered, wantPod: podServerRemote,
			ruleNode: remote, rulePod: e.qualified(podServerRemote), rulePort: probeTCPPort, wantPolicy: np},
		{name: "NetworkPolicy leaves pods it does not select alone", from: podClient, kind: kindHTTP,
			target: e.podAddr(podServerLocal, probeTCPPort), want: WantAnswered, wantPod: podServerLocal,
			ruleNode: e.a, rulePod: e.qualified(podServerLocal), rulePort: probeTCPPort},
	})
}

// clusterPolicyProbes run while clusterNetworkPolicy is in force too: the
// granted client loses server-local, the other client keeps it.
func (e *env) clusterPolicyProbes() []probe {
	cnp := "ClusterNetworkPolicy/" + cnpName(e.ns)
	return inPhase(PhaseClusterPolicy, []probe{
		{name: "ClusterNetworkPolicy (Admin) denies the client it names", from: podClientGranted, kind: kindHTTP,
			target: e.podAddr(podServerLocal, probeTCPPort), want: WantDenied,
			ruleNode: e.a, rulePod: e.qualified(podServerLocal), rulePort: probeTCPPort, wantStage: "admin", wantPolicy: cnp},
		{name: "ClusterNetworkPolicy (Admin) allows a client it does not name", from: podClient, kind: kindHTTP,
			target: e.podAddr(podServerLocal, probeTCPPort), want: WantAnswered, wantPod: podServerLocal,
			ruleNode: e.a, rulePod: e.qualified(podServerLocal), rulePort: probeTCPPort},
	})
}

// inPhase marks probes as the phase's.
func inPhase(phase string, probes []probe) []probe {
	for i := range probes {
		probes[i].phase = phase
	}
	return probes
}

// Execer runs a command in a pod and returns its standard output.
type Execer interface {
	Run(ctx context.Context, p k8s.PodRef, command ...string) ([]byte, error)
}

// attempt runs one try of p from its client pod.
func attempt(ctx context.Context, ex Execer, ns string, p probe, timeout time.Duration) (Result, error) {
	flag := map[string]string{kindHTTP: "--tcp", kindConnect: "--connect", kindUDP: "--udp", kindDNS: "--dns"}[p.kind]
	cmd := []string{probeBinary, "probe", "dial", flag + "=" + p.target, "--timeout=" + timeout.String()}
	// The exec's own round trip comes on top of the attempt.
	ctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	out, err := ex.Run(ctx, k8s.PodRef{Namespace: ns, Pod: p.from, Container: probeContainer}, cmd...)
	if err != nil {
		return Result{}, err
	}
	var r Result
	if err := json.Unmarshal(out, &r); err != nil {
		return Result{}, fmt.Errorf("the probe in %s/%s printed no result (%w): %q", ns, p.from, err, out)
	}
	return r, nil
}

// judge says whether r is what p wants, and if not, why.
func judge(p probe, r Result) (bool, string) {
	switch p.want {
	case WantAnswered:
		if !r.OK {
			return false, r.Error
		}
		if p.wantPod != "" && (r.Answer == nil || r.Answer.Pod != p.wantPod) {
			return false, fmt.Sprintf("answered by %s, want %s", answerer(r), p.wantPod)
		}
		return true, answerDetail(r)
	case WantDenied:
		if r.Outcome == "timeout" || r.Outcome == "refused" {
			return true, r.Outcome
		}
		if r.OK {
			return false, "let through: answered by " + answerer(r)
		}
		return false, r.Error
	case WantRefused:
		switch {
		case r.Outcome == "refused":
			return true, fmt.Sprintf("refused after %.1f ms", r.Millis)
		case r.OK:
			return false, "answered by " + answerer(r) + ", want refused"
		case r.Outcome == "timeout":
			return false, "timed out: a connection nothing can answer should be refused at once"
		}
		return false, r.Error
	}
	return false, "unknown want " + p.want
}

func answerer(r Result) string {
	if r.Answer == nil {
		return "?"
	}
	return r.Answer.Pod
}

func answerDetail(r Result) string {
	switch {
	case r.Answer != nil:
		return "answered by " + r.Answer.Pod + ", saw " + r.Answer.Client
	case len(r.Resolved) > 0:
		return "resolved to " + strings.Join(r.Resolved, ", ")
	}
	return ""
}

// FlowReader reads flows of the agent on a node.
type FlowReader func(ctx context.Context, node string, q api.FlowsQuery) ([]api.Flow, error)

// decidingRule finds the newest flow the judging agent recorded for p's
// connection from clientIP since start (the deciding attempt's start, a
// second of clock difference allowed: an earlier check's flow between
// the same pods is older than one attempt's timeout), and checks a
// denial's stage and policy, and an admission's policy. ok is false when
// the record does not show what p wants.
func decidingRule(ctx context.Context, flows FlowReader, p probe, clientIP string, start time.Time) (rule string, ok bool, why string) {
	if flows == nil || p.rulePod == "" {
		return "", true, ""
	}
	// A denial, or an admission by a named policy, must be on record.
	needed := p.want == WantDenied || p.wantPolicy != ""
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	// The agent reads verdicts in batches (a second apart): the record of
	// a connection that just ended may be a moment away.
	wait := 1500 * time.Millisecond
	if needed {
		wait = 4 * time.Second
	}
	deadline := time.Now().Add(wait)
	var newest *api.Flow
	for {
		var err error
		newest, err = newestFlow(ctx, flows, p, clientIP, start)
		if err != nil {
			return "", !needed, fmt.Sprintf("flows of node %s unreadable: %v", p.ruleNode, err)
		}
		if newest != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if newest == nil {
		return "", !needed, fmt.Sprintf("no flow of node %s records it", p.ruleNode)
	}
	rule = newest.Verdict + ": " + newest.Rule
	if p.want == WantDenied {
		if newest.Verdict != "denied" && newest.Verdict != "rejected" {
			return rule, false, "the newest flow says " + newest.Verdict
		}
		if p.wantStage != "" && newest.Stage != p.wantStage {
			return rule, false, fmt.Sprintf("decided at stage %s, want %s", newest.Stage, p.wantStage)
		}
	}
	if p.wantPolicy != "" && !deciderIs(newest.Decider, p.wantPolicy) {
		return rule, false, "not decided by " + p.wantPolicy
	}
	return rule, true, ""
}

// newestFlow is the newest flow of the judging agent for p's connection
// from clientIP, seen since start less a second (clocks differ).
func newestFlow(ctx context.Context, flows FlowReader, p probe, clientIP string, start time.Time) (*api.Flow, error) {
	q := api.FlowsQuery{FlowFilter: api.FlowFilter{Pod: p.rulePod, Port: p.rulePort, Since: start.Add(-time.Second)}, Limit: api.MaxFlowLimit}
	list, err := flows(ctx, p.ruleNode, q)
	if err != nil {
		return nil, err
	}
	direction := "ingress"
	if p.ruleEgress {
		direction = "egress"
	}
	var newest *api.Flow
	for i := range list {
		f := &list[i]
		if f.Pod != p.rulePod || f.Direction != direction || !fromAddr(f.Src, clientIP) {
			continue
		}
		if newest == nil || !api.LastSeen(*f).Before(api.LastSeen(*newest)) {
			newest = f
		}
	}
	return newest, nil
}

// fromAddr says whether src (address or address:port) is addr.
func fromAddr(src, addr string) bool {
	if ap, err := netip.ParseAddrPort(src); err == nil {
		return ap.Addr().String() == addr
	}
	return src == addr
}

func deciderIs(r *api.FlowRule, kindName string) bool {
	return r != nil && strings.EqualFold(r.Kind+"/"+r.Name, kindName)
}

package api

import (
	"net/url"
	"strconv"
)

// PathTrace is where the agent answers `weir policy trace`.
const PathTrace = "/v1/trace"

// CodeTraceNotLocal: neither end of a traced flow is on the agent's node;
// the error names the nodes that hold them.
const CodeTraceNotLocal = 110

// TraceQuery asks the agent to explain and test one flow. Src and Dst are
// each a pod as namespace/name or an IP address.
type TraceQuery struct {
	Src   string `json:"src"`
	Dst   string `json:"dst"`
	Proto string `json:"proto"` // tcp, udp or icmp
	Port  uint16 `json:"port,omitempty"`
	// HTTP, when set, asks for the L7 verdict on this request of the
	// connection too (TCP only).
	HTTP *TraceRequest `json:"http,omitempty"`
}

// TraceRequest is the request an HTTP trace judges: Method and Path
// (with any query) are required, Host optional.
type TraceRequest struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	Host   string `json:"host,omitempty"`
	// Headers are header fields as sent, "Name: value" each.
	Headers []string `json:"headers,omitempty"`
}

// Values encodes the query for GET PathTrace.
func (q TraceQuery) Values() url.Values {
	v := url.Values{"src": {q.Src}, "dst": {q.Dst}, "proto": {q.Proto}}
	if q.Port != 0 {
		v.Set("port", strconv.Itoa(int(q.Port)))
	}
	if q.HTTP != nil {
		v.Set("method", q.HTTP.Method)
		v.Set("path", q.HTTP.Path)
		if q.HTTP.Host != "" {
			v.Set("host", q.HTTP.Host)
		}
		for _, h := range q.HTTP.Headers {
			v.Add("header", h)
		}
	}
	return v
}

// TraceHTTP is the L7 verdict on a traced request under one end's HTTP
// rules: the server's ingress rules, judged at its node, or the client's
// egress rules, judged on its node as it sends.
type TraceHTTP struct {
	// Verdict: allowed, denied (answered 403), refused (400: the request
	// cannot be read safely), or empty when the connection itself is not
	// allowed or its server is on another node (Note says which).
	Verdict string `json:"verdict,omitempty"`
	// Restricted: L7 policy restricts the connection to HTTP rules.
	Restricted bool `json:"restricted"`
	// Rule is the HTTP rule that allowed it, or why none applies.
	Rule string `json:"rule,omitempty"`
	// Rules are the HTTP rules the connection is judged against, in the
	// order they are tried.
	Rules []string `json:"rules,omitempty"`
	// Kernel says where the datapath judges this request: in the kernel,
	// or left to user space (rules with headers or regular expressions,
	// heads the in-kernel reader cannot hold).
	Kernel string `json:"kernel,omitempty"`
	Note   string `json:"note,omitempty"`
}

// Trace is an agent's explanation of a flow at the ends local to its
// node, confirmed by running the flow's first packet through the loaded
// programs (BPF_PROG_RUN).
type Trace struct {
	Node  string     `json:"node"`
	Src   TracePeer  `json:"src"`
	Dst   TracePeer  `json:"dst"`
	Proto string     `json:"proto"`
	Port  uint16     `json:"port,omitempty"`
	Ends  []TraceEnd `json:"ends"`
	// Program is the entry program the packet ran through, TCVerdict what
	// it returned: ok, shot or redirect.
	Program   string `json:"program"`
	TCVerdict string `json:"tcVerdict"`
	// Verdict is the compiled outcome of the flow on this node: the first
	// end that does not allow, else allowed.
	Verdict string `json:"verdict"`
	// Agree: every end's datapath decision and the program's return match
	// the compiled ones.
	Agree bool `json:"agree"`
	// HTTP is the request's L7 verdict under the server's ingress rules,
	// when the query asked for one; EgressHTTP under the client's egress
	// rules, when the client is local.
	HTTP       *TraceHTTP `json:"http,omitempty"`
	EgressHTTP *TraceHTTP `json:"egressHttp,omitempty"`
}

// TracePeer is one end of a traced flow as the agent resolved it.
type TracePeer struct {
	Pod   string `json:"pod,omitempty"` // namespace/name, when the address is a pod's
	IP    string `json:"ip"`
	Node  string `json:"node,omitempty"` // where the pod runs, when known
	Local bool   `json:"local"`
}

// TraceEnd is the decision at one local end: the source's egress or the
// destination's ingress.
type TraceEnd struct {
	Pod       string `json:"pod"`
	Direction string `json:"direction"` // ingress or egress
	// Enforced: a NetworkPolicy selects the pod in this direction;
	// Tiered: a cluster policy does. Policies names them.
	Enforced bool     `json:"enforced"`
	Tiered   bool     `json:"tiered"`
	Policies []string `json:"policies,omitempty"`
	// PeerIdentity and PeerCIDRIdentity are what the peer's address is
	// looked up under: its label identity and its ipBlock identity.
	PeerIdentity     string `json:"peerIdentity"`
	PeerCIDRIdentity string `json:"peerCIDRIdentity"`
	// Steps are the precedence steps evaluated, in order, with what each
	// found.
	Steps    []string      `json:"steps"`
	Compiled TraceDecision `json:"compiled"`
	// Datapath is the verdict event of the run; nil when the packet never
	// reached this end (the source's egress dropped it).
	Datapath *TraceDecision `json:"datapath,omitempty"`
	Agree    bool           `json:"agree"`
}

// TraceDecision is a policy decision and the rules behind it.
type TraceDecision struct {
	Verdict    string `json:"verdict"` // allowed, denied, rejected
	Stage      string `json:"stage"`
	Rule       uint32 `json:"rule,omitempty"`
	RuleName   string `json:"ruleName,omitempty"`
	Log        uint32 `json:"log,omitempty"`
	LogName    string `json:"logName,omitempty"`
	Passed     uint32 `json:"passed,omitempty"`
	PassedName string `json:"passedName,omitempty"`
}

package api

import (
	"fmt"
	"net/netip"
	"time"
)

// Paths served by the agent.
const (
	PathEndpoints = "/v1/endpoints"
	PathGC        = "/v1/gc"
	PathHealth    = "/v1/healthz"
	PathStatus    = "/v1/status"
	PathPeers     = "/v1/peers"
	PathFlows     = "/v1/flows"
	PathServices  = "/v1/services"
	PathVersion   = "/v1/version"
)

// Attachment names one interface of one container.
type Attachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

// AddRequest asks the agent to attach a pod interface.
type AddRequest struct {
	Attachment
	NetNS        string `json:"netns"`
	PodNamespace string `json:"podNamespace,omitempty"`
	PodName      string `json:"podName,omitempty"`
	// PortMappings are the pod's hostPorts, from the runtime's
	// portMappings capability.
	PortMappings []PortMapping `json:"portMappings,omitempty"`
}

// PortMapping is one hostPort of a pod: connections to the node's address
// (or HostIP) at HostPort go to the pod's ContainerPort.
type PortMapping struct {
	HostPort      uint16 `json:"hostPort"`
	ContainerPort uint16 `json:"containerPort"`
	Protocol      string `json:"protocol"` // tcp or udp
	HostIP        string `json:"hostIP,omitempty"`
}

// Validate reports what is wrong with m.
func (m PortMapping) Validate() error {
	switch {
	case m.HostPort == 0 || m.ContainerPort == 0:
		return fmt.Errorf("port mapping %d->%d: both ports must be set", m.HostPort, m.ContainerPort)
	case m.Protocol != "tcp" && m.Protocol != "udp":
		return fmt.Errorf("port mapping %d->%d: protocol %q, want tcp or udp", m.HostPort, m.ContainerPort, m.Protocol)
	}
	if m.HostIP != "" && m.HostIP != "0.0.0.0" {
		if a, err := netip.ParseAddr(m.HostIP); err != nil || !a.Is4() {
			return fmt.Errorf("port mapping %d->%d: hostIP %q is not an IPv4 address", m.HostPort, m.ContainerPort, m.HostIP)
		}
	}
	return nil
}

// Validate reports what is missing or malformed, naming the CNI variable.
func (r AddRequest) Validate() error {
	if err := r.Attachment.Validate(); err != nil {
		return err
	}
	if r.NetNS == "" {
		return fmt.Errorf("CNI_NETNS is empty: the runtime must pass the pod's network namespace path")
	}
	for _, m := range r.PortMappings {
		if err := m.Validate(); err != nil {
			return fmt.Errorf("runtimeConfig.portMappings: %w", err)
		}
	}
	return nil
}

// Validate checks the identifiers of an attachment.
func (a Attachment) Validate() error {
	switch {
	case a.ContainerID == "":
		return fmt.Errorf("CNI_CONTAINERID is empty")
	case a.IfName == "":
		return fmt.Errorf("CNI_IFNAME is empty")
	case len(a.IfName) > 15:
		return fmt.Errorf("CNI_IFNAME %q is longer than 15 bytes", a.IfName)
	case a.IfName == "." || a.IfName == ".." || containsAny(a.IfName, "/: \t\n"):
		return fmt.Errorf("CNI_IFNAME %q is not a valid interface name", a.IfName)
	}
	return nil
}

func containsAny(s, chars string) bool {
	for _, c := range s {
		for _, d := range chars {
			if c == d {
				return true
			}
		}
	}
	return false
}

// AddResponse describes the attached interface.
type AddResponse struct {
	IfName     string       `json:"ifName"`
	MAC        string       `json:"mac"`
	NetNS      string       `json:"netns"`
	HostIfName string       `json:"hostIfName"`
	HostMAC    string       `json:"hostMac"`
	Address    netip.Prefix `json:"address"`
	Gateway    netip.Addr   `json:"gateway"`
	MTU        int          `json:"mtu"`
}

// DelRequest detaches a pod interface; NetNS may be empty (pod gone).
type DelRequest struct {
	Attachment
	NetNS string `json:"netns,omitempty"`
}

// CheckRequest asks whether an attachment is intact.
type CheckRequest = DelRequest

// GCRequest lists every attachment the runtime still knows; the agent
// releases all others.
type GCRequest struct {
	Valid []Attachment `json:"valid"`
}

// GCResponse lists what was released.
type GCResponse struct {
	Released []Attachment `json:"released"`
}

// Peer is another node: its underlay address and pod CIDR.
type Peer struct {
	Name    string       `json:"name"`
	NodeIP  netip.Addr   `json:"nodeIP"`
	PodCIDR netip.Prefix `json:"podCIDR"`
}

// PeersRequest replaces the agent's set of peers.
type PeersRequest struct {
	Peers []Peer `json:"peers"`
}

// Endpoint is one local pod interface in the agent's status.
type Endpoint struct {
	Attachment
	Address      netip.Addr `json:"address"`
	HostIfName   string     `json:"hostIfName"`
	PodNamespace string     `json:"podNamespace,omitempty"`
	PodName      string     `json:"podName,omitempty"`
	// NetNS is the pod's network namespace as the runtime named it in ADD.
	NetNS string `json:"netns,omitempty"`
	// Labels are the pod's labels as the API server last said (Kubernetes mode).
	Labels map[string]string `json:"labels,omitempty"`
}

// Status is the agent's view of its node.
type Status struct {
	Node       string            `json:"node"`
	Ready      bool              `json:"ready"`
	Mode       string            `json:"mode"`
	NodeIP     netip.Addr        `json:"nodeIP"`
	PodCIDR    netip.Prefix      `json:"podCIDR"`
	MTU        int               `json:"mtu"`
	Capacity   int               `json:"capacity"`
	Endpoints  []Endpoint        `json:"endpoints"`
	Peers      []Peer            `json:"peers"`
	MapEntries int               `json:"endpointMapEntries"`
	Counters   map[string]uint64 `json:"counters"`
	Kubernetes *KubeStatus       `json:"kubernetes,omitempty"`
	Policy     *PolicyStatus     `json:"policy,omitempty"`
	Services   *ServicesSummary  `json:"services,omitempty"`
}

// ServicesSummary counts what the node translates Service addresses to
// (Kubernetes mode).
type ServicesSummary struct {
	// KubeProxyReplacement: no kube-proxy beside the agent (see
	// weir-agent --kube-proxy-replacement).
	KubeProxyReplacement bool `json:"kubeProxyReplacement"`
	// SocketLBOff: weir-agent --socket-lb=false, kube-proxy answers every
	// Service and the maps stay empty.
	SocketLBOff bool `json:"socketLBOff,omitempty"`
	Frontends   int  `json:"frontends"`
	Backends    int  `json:"backends"`
	// Refusing counts frontends without a backend, refused at once.
	Refusing int `json:"refusing"`
	// Error is why the last write of the service maps failed.
	Error string `json:"error,omitempty"`
}

// ServiceList is what one node translates each Service address to, read
// from its service maps.
type ServiceList struct {
	Node                 string `json:"node"`
	KubeProxyReplacement bool   `json:"kubeProxyReplacement"`
	SocketLBOff          bool   `json:"socketLBOff,omitempty"` // see ServicesSummary
	// InSync says the maps hold exactly the table the agent last built;
	// false after a failed write (retried on the next change).
	InSync    bool              `json:"inSync"`
	Frontends []ServiceFrontend `json:"frontends"`
}

// ServiceFrontend is one Service address and where its connections go.
type ServiceFrontend struct {
	Addr     netip.Addr `json:"addr"`
	Port     uint16     `json:"port"`
	Protocol string     `json:"protocol"`
	// Service is "namespace/name"; empty if the agent no longer knows it.
	Service string `json:"service,omitempty"`
	// External: the entry packets from outside the cluster are translated
	// with (externalTrafficPolicy applies); otherwise sockets on the node.
	External bool             `json:"external,omitempty"`
	Backends []ServiceBackend `json:"backends"`
	// AffinitySeconds is the sessionAffinity: ClientIP timeout; 0: none.
	AffinitySeconds int `json:"affinitySeconds,omitempty"`
	// State is "serving", "refusing" for a frontend without backends, or
	// "dropping" for an external one whose policy keeps traffic local.
	State string `json:"state"`
}

// ServiceBackend is one address a frontend's connections go to.
type ServiceBackend struct {
	Addr netip.Addr `json:"addr"`
	Port uint16     `json:"port"`
}

// PolicyStatus is what the agent last loaded into its datapath.
type PolicyStatus struct {
	Loaded time.Time `json:"loaded,omitzero"`
	// Error is why the last load failed (its endpoints fail closed).
	Error string `json:"error,omitempty"`
	// Endpoints, Rules and Entries count the compiled state: local
	// endpoints, rules in use, policy map entries.
	Endpoints int `json:"endpoints"`
	Rules     int `json:"rules"`
	Entries   int `json:"entries"`
	// CompileErrors are policies that could not be compiled, each
	// failing closed as docs/policy.md says.
	CompileErrors []string `json:"compileErrors,omitempty"`
	// ClusterPolicies maps Kind/name (WeirNetworkPolicy/namespace/name for
	// that namespaced kind) to the generation programmed here.
	ClusterPolicies map[string]int64 `json:"clusterPolicies,omitempty"`
	// Warnings are "Kind/name: warning" of the policies this node
	// enforces otherwise than they read (k8s.PolicyAck.Warning).
	Warnings []string `json:"warnings,omitempty"`
	// Maps is the fill of the datapath's maps, by name.
	Maps map[string]MapFill `json:"maps,omitempty"`
}

// MapFill is one map's entries against its capacity.
type MapFill struct {
	Entries  int `json:"entries"`
	Capacity int `json:"capacity"`
}

// KubeStatus is the agent's link to the API server.
type KubeStatus struct {
	// Synced is true once the agent has a full view of nodes and pods.
	Synced bool `json:"synced"`
	// LastApplied is when the agent last programmed a snapshot.
	LastApplied time.Time `json:"lastApplied,omitzero"`
	// Pods is how many pods the API server places on this node.
	Pods int `json:"pods"`
	// Reported is when the Node last got the agent's state; ReportError
	// says why the last attempt failed, if it did.
	Reported    time.Time `json:"reported,omitzero"`
	ReportError string    `json:"reportError,omitempty"`
}

// Flow is one policy verdict of a node's datapath, with the names the
// agent knows for its parties.
type Flow struct {
	Time time.Time `json:"time"`
	Node string    `json:"node"`
	// Verdict is "allowed" (a new connection), "denied" or "rejected";
	// or "forwarded", no verdict: the node translated a flow from outside
	// the cluster (a NodePort, an external address) to a backend on
	// another node, which judges it. Such a record's Pod is that backend.
	Verdict   string `json:"verdict"`
	Direction string `json:"direction"` // of the local pod: ingress or egress
	Pod       string `json:"pod"`       // the local pod judged, namespace/name
	// Src is the address:port of the first packet; in an aggregate
	// (Count set) it is the address alone, as its flows came from many
	// ephemeral source ports.
	Src   string `json:"src"`
	Dst   string `json:"dst"`
	Proto string `json:"proto"`
	// Service is the Service (namespace/name; a pod's hostPort says so)
	// whose address the client named, when the client's node translated
	// the connection at its socket: Dst is the backend it was sent to.
	// ServiceAddr is the address and port the client named (a ClusterIP,
	// a node's NodePort, ...). Both are empty when the client named Dst
	// itself, or on the backend's node when the client is on another
	// (that node never saw the Service address): a flow from outside
	// that another node forwarded is named by that node's "forwarded"
	// record. Service alone is empty when the Service is gone by the
	// time the record is named.
	Service     string `json:"service,omitempty"`
	ServiceAddr string `json:"serviceAddr,omitempty"`
	// ServiceByClient says the Service was found by the client pod and
	// the backend port, not by the connection's own socket: a UDP socket
	// connect()ed before it had a port. A flow the same pod sent straight
	// to that backend port at the same time is named the same.
	ServiceByClient bool `json:"serviceByClient,omitempty"`
	// Peer is the other end: a pod's namespace/name, a node, or an address.
	Peer         string   `json:"peer"`
	PeerIdentity uint32   `json:"peerIdentity"`
	PeerLabels   []string `json:"peerLabels,omitempty"`
	// Rule is what decided, in words: a rule, or why none did.
	Rule string `json:"rule"`
	// Stage is the step of the precedence order that decided: admin,
	// networkpolicy, networkpolicy-default-deny, baseline, default (no
	// cluster policy decided, none selects for NetworkPolicy) or
	// unenforced (no policy selects the pod).
	Stage string `json:"stage,omitempty"`
	// Decider is the rule that decided, when one did.
	Decider *FlowRule `json:"decider,omitempty"`
	// LoggedBy is a Log rule the evaluation passed on its way.
	LoggedBy *FlowRule `json:"loggedBy,omitempty"`
	// PassedBy is the Pass rule that sent evaluation to a later tier.
	PassedBy *FlowRule `json:"passedBy,omitempty"`
	// Count, when set, makes this an aggregate of that many flows with
	// the same parties, port and verdict, the first at Time and the last
	// at LastTime. Zero: a single flow.
	Count    uint64    `json:"count,omitempty"`
	LastTime time.Time `json:"lastTime,omitzero"`
	// PortsFolded, when set, makes this the denied flows of one second
	// from Src to that many ports of Dst (an address, no port): a scan,
	// kept as one record so it cannot rotate the history out.
	// PeersFolded is the same over that many destinations (Dst and Peer
	// empty).
	PortsFolded int `json:"portsFolded,omitempty"`
	PeersFolded int `json:"peersFolded,omitempty"`
	// HTTP makes this the record of requests L7 policy judged on a
	// connection into Pod (Stage "http"): Verdict is allowed, denied (no
	// HTTP rule allows it), refused (the stream could not be read
	// safely) or unjudged (the kernel could not judge it; the connection
	// is closed). Nil for a connection's record.
	HTTP *FlowHTTP `json:"http,omitempty"`
}

// FlowHTTP is the request an HTTP record is about.
type FlowHTTP struct {
	Method string `json:"method,omitempty"`
	Host   string `json:"host,omitempty"`
	// Target is the request target as sent (path and query); TargetCut
	// says the record kept only its start.
	Target    string `json:"target,omitempty"`
	TargetCut bool   `json:"targetCut,omitempty"`
	// Status is the answer the client got: the one Weir wrote in the
	// server's place (403, 400), or for an allowed request the server's
	// own, read in the kernel (Latency then set). 0: no answer was
	// read (the connection closed without one, or it came later than a
	// second and has a Reply record of its own, or the connection's
	// answers are not read: it pipelines, or user space judged it on
	// HTTP/1; an HTTP/2 request's answer passes the proxy and is read).
	Status int `json:"status,omitempty"`
	// Reply makes the record one of the server's answers alone (Count
	// of them, all of Status) to a request recorded before it on the
	// connection, whose Method, Host, Target and Rule it repeats.
	// Latency is the answers' mean time from the request going on to
	// the answer's first byte, LatencyMax the longest (nanoseconds).
	Reply      bool          `json:"reply,omitempty"`
	Latency    time.Duration `json:"latency,omitempty"`
	LatencyMax time.Duration `json:"latencyMax,omitempty"`
	// Rule is the HTTP rule that allowed it (Decider is its policy rule).
	Rule *FlowHTTPRule `json:"rule,omitempty"`
	// Reason says why a refused or unjudged request was.
	Reason string `json:"reason,omitempty"`
	// Closed: the connection carried no more bytes after it.
	Closed bool `json:"closed,omitempty"`
}

// FlowHTTPRule names an HTTP rule within its policy rule:
// ports[Port].http[Index], and what it matches.
type FlowHTTPRule struct {
	Port  int    `json:"port"`
	Index int    `json:"index"`
	Match string `json:"match"`
}

// FlowRule names one rule of a policy.
type FlowRule struct {
	Kind      string `json:"kind"` // NetworkPolicy, ClusterNetworkPolicy, WeirClusterNetworkPolicy
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Tier      string `json:"tier,omitempty"` // cluster kinds: Admin or Baseline
	Priority  int32  `json:"priority,omitempty"`
	Direction string `json:"direction"`
	Index     int    `json:"index"` // in spec.ingress or spec.egress
	RuleName  string `json:"ruleName,omitempty"`
	Action    string `json:"action,omitempty"` // cluster kinds: Accept, Deny, Pass, Reject, Log
}

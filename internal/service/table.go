package service

import (
	"cmp"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// IP protocol numbers of the protocols a frontend can have.
const (
	ProtoTCP uint8 = 6
	ProtoUDP uint8 = 17
)

// Frontend is one address a client can ask for: a ClusterIP, port and protocol.
type Frontend struct {
	Addr  netip.Addr
	Port  uint16
	Proto uint8
	// External marks the entry for packets from outside the cluster to
	// a NodePort, external IP or load balancer IP (externalTrafficPolicy
	// applies); otherwise it serves this node's sockets.
	External bool
}

// Backend is an address a Frontend's connections go to.
type Backend struct {
	Addr netip.Addr
	Port uint16
}

// Entry is how a frontend's connections are translated.
type Entry struct {
	// Backends are sorted and without duplicates. Empty only when Weir
	// replaces kube-proxy: a socket to the frontend is then refused at
	// once (kube-proxy's REJECT), rather than left to time out; a packet
	// from outside is left to the node's stack, which refuses it, or
	// dropped (DropWhenEmpty).
	Backends []Backend
	// AffinityTimeout, when set (sessionAffinity: ClientIP), keeps a
	// client on the backend it last used for as long as it keeps coming
	// back within this time.
	AffinityTimeout time.Duration
	// DropWhenEmpty: an external entry of an externalTrafficPolicy: Local
	// Service without an endpoint on this node drops what arrives, as
	// kube-proxy does, rather than refusing it.
	DropWhenEmpty bool
}

// Equal reports whether e and o translate alike.
func (e Entry) Equal(o Entry) bool {
	return e.AffinityTimeout == o.AffinityTimeout && e.DropWhenEmpty == o.DropWhenEmpty && slices.Equal(e.Backends, o.Backends)
}

// Table maps each frontend to how it is translated.
type Table map[Frontend]Entry

// Loopback is where the node's own processes also reach every NodePort.
var Loopback = netip.AddrFrom4([4]byte{127, 0, 0, 1})

// AnyNode is the address of a NodePort's socket frontend that serves it
// at every node's address (Options.NodeAddrs).
var AnyNode = netip.IPv4Unspecified()

// Options says whose view a table is built for.
type Options struct {
	// Node is the node the table is for (internalTrafficPolicy: Local),
	// and Zone its topology.kubernetes.io/zone label: where the
	// EndpointSlice controller's hints (trafficDistribution) send its
	// clients.
	Node, Zone string
	// ReplaceKubeProxy says no kube-proxy runs beside Weir, so the table
	// must answer every ClusterIP itself: frontends without backends
	// reject, and Services with session affinity are translated too.
	// Without it, both are left to kube-proxy, and so are NodePorts,
	// externalIPs and load balancer addresses.
	ReplaceKubeProxy bool
	// NodeAddrs are the addresses of every node, where NodePorts are
	// served: a socket on this node that names any node's NodePort is
	// sent straight to a backend (with ReplaceKubeProxy). A NodePort's
	// socket frontend is one, at AnyNode, which the datapath serves at
	// each of these; an externalTrafficPolicy: Local NodePort has one at
	// each.
	NodeAddrs []netip.Addr
	// AddrNode names the node each of NodeAddrs belongs to: a socket
	// naming another node's NodePort of an externalTrafficPolicy: Local
	// Service goes to that node's endpoints alone.
	AddrNode map[netip.Addr]string
	// OwnAddrs are this node's addresses: packets from outside reach a
	// NodePort there (with ReplaceKubeProxy).
	OwnAddrs []netip.Addr
	// Reserved are ports the node's own traffic arrives on (the overlay's
	// UDP port): an external IP or load balancer IP frontend on one of
	// them is left out, so no Service (CVE-2020-8554's externalIPs) can
	// capture the cluster's tunnel traffic.
	Reserved []PortProto
}

// LabelServiceProxyName, on a Service or EndpointSlice, hands it to
// another Service proxy (kube-proxy's apis.LabelServiceProxyName): the
// default proxy, Weir as kube-proxy, leaves it alone.
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// Proxied says whether the default Service proxy serves an object with
// these labels: not when another proxy is named, nor for an
// EndpointSlice (or Service) marked headless, which kube-proxy's
// informers leave out by label (both labels must not exist).
func Proxied(labels map[string]string) bool {
	_, other := labels[LabelServiceProxyName]
	_, headless := labels[corev1.IsHeadlessService]
	return !other && !headless
}

// PortProto is a port and an IP protocol number.
type PortProto struct {
	Port  uint16
	Proto uint8
}

// serviceFrontend is one address of a Service and the port it serves.
type serviceFrontend struct {
	Frontend
	port corev1.ServicePort
	// internal: a ClusterIP, where internalTrafficPolicy applies. A
	// NodePort, external IP or load balancer address reached from inside
	// the cluster is served by every endpoint, as kube-proxy serves
	// traffic from its own node; reached from outside (External), by
	// the endpoints externalTrafficPolicy allows.
	internal bool
	// onlyNode, if set, is the node whose endpoints alone serve the
	// frontend: another node's externalTrafficPolicy: Local NodePort.
	onlyNode string
}

// frontendsOf lists the addresses svc is reached at: its ClusterIPs and,
// when Weir replaces kube-proxy, its NodePort on every node address, its
// externalIPs and its load balancer ingress IPs.
func frontendsOf(svc *corev1.Service, opts Options) []serviceFrontend {
	var out []serviceFrontend
	add := func(addrs []netip.Addr, internal bool, port func(corev1.ServicePort) int32) {
		for _, a := range addrs {
			for _, sp := range svc.Spec.Ports {
				proto, ok := protoNumber(sp.Protocol)
				p := port(sp)
				if !ok || p <= 0 || p > 65535 || (!internal && slices.Contains(opts.Reserved, PortProto{Port: uint16(p), Proto: proto})) {
					continue
				}
				out = append(out, serviceFrontend{Frontend: Frontend{Addr: a, Port: uint16(p), Proto: proto}, port: sp, internal: internal})
			}
		}
	}
	servicePort := func(sp corev1.ServicePort) int32 { return sp.Port }
	add(clusterIPv4s(svc), true, servicePort)
	if !opts.ReplaceKubeProxy {
		return out
	}
	nodePort := func(sp corev1.ServicePort) int32 { return sp.NodePort }
	var lbIPs []string
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, in := range svc.Status.LoadBalancer.Ingress {
			lbIPs = append(lbIPs, in.IP)
		}
	}
	hasNodePorts := svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer
	switch {
	case hasNodePorts && svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal:
		// One entry for every node's address (AnyNode): a NodePort
		// costs one frontend whatever the number of nodes.
		add([]netip.Addr{AnyNode}, false, nodePort)
	case hasNodePorts:
		// A socket naming another node's NodePort of an
		// externalTrafficPolicy: Local Service is served as that node
		// serves the packet (kube-proxy's rules match this node's
		// addresses alone, so the packet would reach it): by its own
		// endpoints; with none, the frontend is left out and the packet
		// goes there to be dropped. So each node's address has an entry
		// of its own.
		first := len(out)
		add(opts.NodeAddrs, false, nodePort)
		for i := first; i < len(out); i++ {
			if n, ok := opts.AddrNode[out[i].Addr]; ok && n != opts.Node {
				out[i].onlyNode = n
			}
		}
	}
	if hasNodePorts {
		// kube-proxy's localhost NodePorts: the node's own processes
		// reach a NodePort at 127.0.0.1 too (sock.c translates it for
		// the node's namespace only; a pod's loopback is its own).
		add([]netip.Addr{Loopback}, false, nodePort)
	}
	add(parseIPv4s(svc.Spec.ExternalIPs), false, servicePort)
	add(parseIPv4s(lbIPs), false, servicePort)
	// The same addresses as packets from outside reach them here.
	sockets := len(out)
	if hasNodePorts {
		add(opts.OwnAddrs, false, nodePort)
	}
	add(parseIPv4s(svc.Spec.ExternalIPs), false, servicePort)
	add(parseIPv4s(lbIPs), false, servicePort)
	for i := sockets; i < len(out); i++ {
		out[i].External = true
	}
	return out
}

// Build computes the table of svcs, with backends from slices, as seen from
// opts.Node.
func Build(svcs []*corev1.Service, endpointSlices []*discoveryv1.EndpointSlice, opts Options) Table {
	return filled(svcs, endpointSlices, opts).Table()
}

// filled is a Cache holding svcs and their slices.
func filled(svcs []*corev1.Service, endpointSlices []*discoveryv1.EndpointSlice, opts Options) *Cache {
	c := NewCache(opts)
	bySvc := GroupSlices(endpointSlices)
	for _, svc := range svcs {
		key := Key(svc.Namespace, svc.Name)
		c.Update(key, svc, bySvc[key])
	}
	c.Flush()
	return c
}

// translatable reports whether Weir serves svc's ClusterIPs itself.
func translatable(svc *corev1.Service, replaceKubeProxy bool) bool {
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return false
	}
	// Beside kube-proxy, affinity is left to the per-client memory
	// kube-proxy already keeps.
	return replaceKubeProxy || svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP
}

// affinityTimeout is svc's ClientIP affinity timeout, kube-proxy's default
// (three hours) when the Service names none; zero without affinity.
func affinityTimeout(svc *corev1.Service) time.Duration {
	if svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP {
		return 0
	}
	secs := corev1.DefaultClientIPServiceAffinitySeconds
	if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil && *c.ClientIP.TimeoutSeconds > 0 {
		secs = *c.ClientIP.TimeoutSeconds
	}
	return time.Duration(secs) * time.Second
}

func clusterIPv4s(svc *corev1.Service) []netip.Addr {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	return parseIPv4s(ips) // "None" (headless) does not parse
}

// parseIPv4s keeps the IPv4 addresses of ips.
func parseIPv4s(ips []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
			out = append(out, a)
		}
	}
	return out
}

func protoNumber(p corev1.Protocol) (uint8, bool) {
	switch p {
	case corev1.ProtocolTCP, "":
		return ProtoTCP, true
	case corev1.ProtocolUDP:
		return ProtoUDP, true
	}
	return 0, false // SCTP: not translated at the socket
}

// candidate is a ready endpoint address with the EndpointSlice
// controller's hints for it.
type candidate struct {
	Backend
	zones, nodes []string
}

// backends picks the endpoints of one Service port the way kube-proxy does:
// only this node's with local; else the ready ones, narrowed by their
// topology hints (hintsFilter); the serving terminating ones when none is
// ready.
func backends(endpointSlices []*discoveryv1.EndpointSlice, sp corev1.ServicePort, opts Options, local bool) []Backend {
	var ready []candidate
	var terminating []Backend
	for _, s := range endpointSlices {
		port, ok := slicePort(s, sp)
		if !ok {
			continue
		}
		for _, ep := range s.Endpoints {
			if local && (ep.NodeName == nil || *ep.NodeName != opts.Node) {
				continue
			}
			isReady := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			serving := ep.Conditions.Serving == nil || *ep.Conditions.Serving
			isTerminating := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
			for _, s := range ep.Addresses {
				a, err := netip.ParseAddr(s)
				if err != nil || !a.Is4() {
					continue
				}
				switch b := (Backend{Addr: a, Port: port}); {
				case isReady:
					zones, nodes := hints(ep.Hints)
					ready = append(ready, candidate{Backend: b, zones: zones, nodes: nodes})
				case serving && isTerminating:
					terminating = append(terminating, b)
				}
			}
		}
	}
	if !local {
		ready = hintsFilter(ready, opts)
	}
	out := terminating
	if len(ready) > 0 {
		out = make([]Backend, len(ready))
		for i, c := range ready {
			out[i] = c.Backend
		}
	}
	slices.SortFunc(out, func(a, b Backend) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
	})
	return slices.Compact(out)
}

func hints(h *discoveryv1.EndpointHints) (zones, nodes []string) {
	if h == nil {
		return nil, nil
	}
	for _, z := range h.ForZones {
		zones = append(zones, z.Name)
	}
	for _, n := range h.ForNodes {
		nodes = append(nodes, n.Name)
	}
	return zones, nodes
}

// hintsFilter narrows ready endpoints to the ones their hints give this
// node, as kube-proxy does for trafficDistribution (PreferSameNode,
// PreferSameZone, PreferClose): to the endpoints hinted for this node
// when every endpoint has node hints and one names it; else to those
// hinted for this node's zone when every endpoint has zone hints and one
// names it; else all of them. An endpoint without hints, a node without
// a zone or hints naming only other zones leave every endpoint in.
func hintsFilter(ready []candidate, opts Options) []candidate {
	allNodes, allZones := len(ready) > 0, len(ready) > 0
	var forNode, forZone []candidate
	for _, c := range ready {
		allNodes = allNodes && len(c.nodes) > 0
		allZones = allZones && len(c.zones) > 0
		if slices.Contains(c.nodes, opts.Node) {
			forNode = append(forNode, c)
		}
		if opts.Zone != "" && slices.Contains(c.zones, opts.Zone) {
			forZone = append(forZone, c)
		}
	}
	switch {
	case allNodes && len(forNode) > 0:
		return forNode
	case allZones && len(forZone) > 0:
		return forZone
	}
	return ready
}

// slicePort finds the port number a Service port has in one EndpointSlice:
// the slice's port of the same name and protocol.
func slicePort(s *discoveryv1.EndpointSlice, sp corev1.ServicePort) (uint16, bool) {
	proto := sp.Protocol
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	for _, p := range s.Ports {
		name, pproto := "", corev1.ProtocolTCP
		if p.Name != nil {
			name = *p.Name
		}
		if p.Protocol != nil {
			pproto = *p.Protocol
		}
		if name == sp.Name && pproto == proto && p.Port != nil && *p.Port > 0 && *p.Port < 65536 {
			return uint16(*p.Port), true
		}
	}
	return 0, false
}

// Removed lists, for each frontend of old, the backends it had that new no
// longer gives it: a frontend new lacks lost them all. Connections a
// client made through such a frontend to such a backend lead where the
// Service no longer sends anyone, and are to be closed.
func Removed(old, new Table) map[Frontend][]Backend {
	out := map[Frontend][]Backend{}
	for f, e := range old {
		keep := new[f].Backends
		for _, b := range e.Backends {
			if !slices.Contains(keep, b) {
				out[f] = append(out[f], b)
			}
		}
	}
	return out
}

// Owners names the Service ("namespace/name") each frontend Build gives
// svcs with opts belongs to, for showing a table to people.
func Owners(svcs []*corev1.Service, opts Options) map[Frontend]string {
	return filled(svcs, nil, opts).owners
}

// comparePrecedence orders Services for claiming a frontend two of them
// share: the older first, then by namespace and name.
func comparePrecedence(a, b *corev1.Service) int {
	return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// HealthCheck is what a Service's healthCheckNodePort answers on a node:
// kube-proxy's contract, so a cloud load balancer sends traffic only to
// nodes with an endpoint of an externalTrafficPolicy: Local Service.
type HealthCheck struct {
	Namespace, Name string
	// LocalEndpoints counts the Service's ready endpoints on the node:
	// the check answers 200 with some, 503 with none.
	LocalEndpoints int
}

// HealthChecks lists the health check node ports node serves, by port:
// one per LoadBalancer Service with externalTrafficPolicy: Local.
func HealthChecks(svcs []*corev1.Service, endpointSlices []*discoveryv1.EndpointSlice, node string) map[uint16]HealthCheck {
	c := filled(svcs, endpointSlices, Options{Node: node})
	return c.HealthChecks()
}

// healthCheckPort is svc's health check node port, if it has one this
// proxy serves.
func healthCheckPort(svc *corev1.Service) (uint16, bool) {
	port := svc.Spec.HealthCheckNodePort
	if !Proxied(svc.Labels) || svc.Spec.Type != corev1.ServiceTypeLoadBalancer || svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal || port <= 0 || port > 65535 {
		return 0, false
	}
	return uint16(port), true
}

// healthCheckOf counts svc's ready endpoints on node, each address once.
func healthCheckOf(svc *corev1.Service, endpointSlices []*discoveryv1.EndpointSlice, node string) HealthCheck {
	hc := HealthCheck{Namespace: svc.Namespace, Name: svc.Name}
	seen := map[string]bool{}
	for _, s := range endpointSlices {
		if !Proxied(s.Labels) {
			continue
		}
		for _, ep := range s.Endpoints {
			ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			if !ready || ep.NodeName == nil || *ep.NodeName != node || len(ep.Addresses) == 0 || seen[ep.Addresses[0]] {
				continue
			}
			seen[ep.Addresses[0]] = true
			hc.LocalEndpoints++
		}
	}
	return hc
}

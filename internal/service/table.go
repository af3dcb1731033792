package service

import (
	"cmp"
	"net/netip"
	"slices"

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
}

// Backend is an address a Frontend's connections go to.
type Backend struct {
	Addr netip.Addr
	Port uint16
}

// Table maps each frontend to its backends, sorted and without duplicates.
// Every frontend has at least one backend.
type Table map[Frontend][]Backend

// Build computes the table of svcs, with backends from slices, as seen from
// node (for internalTrafficPolicy: Local).
func Build(svcs []*corev1.Service, endpointSlices []*discoveryv1.EndpointSlice, node string) Table {
	bySvc := map[string][]*discoveryv1.EndpointSlice{}
	for _, s := range endpointSlices {
		name := s.Labels[discoveryv1.LabelServiceName]
		if name == "" || s.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		k := s.Namespace + "/" + name
		bySvc[k] = append(bySvc[k], s)
	}
	t := Table{}
	for _, svc := range svcs {
		if !translatable(svc) {
			continue
		}
		local := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
		for _, ip := range clusterIPv4s(svc) {
			for _, sp := range svc.Spec.Ports {
				proto, ok := protoNumber(sp.Protocol)
				if !ok {
					continue
				}
				bes := backends(bySvc[svc.Namespace+"/"+svc.Name], sp, node, local)
				if len(bes) == 0 {
					continue
				}
				t[Frontend{Addr: ip, Port: uint16(sp.Port), Proto: proto}] = bes
			}
		}
	}
	return t
}

// translatable reports whether Weir serves svc's ClusterIPs itself.
func translatable(svc *corev1.Service) bool {
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return false
	}
	// Affinity needs per-client memory kube-proxy already keeps.
	return svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP
}

func clusterIPv4s(svc *corev1.Service) []netip.Addr {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []netip.Addr
	for _, s := range ips {
		if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
			out = append(out, a) // "None" (headless) does not parse
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

// backends picks the endpoints of one Service port the way kube-proxy does.
func backends(endpointSlices []*discoveryv1.EndpointSlice, sp corev1.ServicePort, node string, local bool) []Backend {
	var ready, terminating []Backend
	for _, s := range endpointSlices {
		port, ok := slicePort(s, sp)
		if !ok {
			continue
		}
		for _, ep := range s.Endpoints {
			if local && (ep.NodeName == nil || *ep.NodeName != node) {
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
					ready = append(ready, b)
				case serving && isTerminating:
					terminating = append(terminating, b)
				}
			}
		}
	}
	if len(ready) == 0 {
		ready = terminating
	}
	slices.SortFunc(ready, func(a, b Backend) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
	})
	return slices.Compact(ready)
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

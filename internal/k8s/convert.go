package k8s

import (
	"maps"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
)

// nodeFrom converts a Node object; addresses that do not parse are left out.
func nodeFrom(n *corev1.Node) Node {
	out := Node{Name: n.Name, Labels: maps.Clone(n.Labels), Agent: agentStateFrom(n.Annotations)}
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil && (!out.InternalIP.IsValid() || ip.Is4()) {
			out.InternalIP = ip
		}
	}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out.PodCIDRs = append(out.PodCIDRs, p.Masked())
		}
	}
	return out
}

// podFrom converts a Pod object.
func podFrom(p *corev1.Pod) Pod {
	out := Pod{
		Namespace: p.Namespace, Name: p.Name, UID: string(p.UID),
		HostNetwork: p.Spec.HostNetwork, NodeName: p.Spec.NodeName,
		Terminal: p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed,
	}
	if len(p.Labels) > 0 {
		out.Labels = make(map[string]string, len(p.Labels))
		for k, v := range p.Labels {
			out.Labels[k] = v
		}
	}
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out.IPs = append(out.IPs, a)
		}
	}
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			proto := string(port.Protocol)
			if proto == "" {
				proto = string(corev1.ProtocolTCP)
			}
			out.Ports = append(out.Ports, ContainerPort{Name: port.Name, Port: port.ContainerPort, Protocol: proto})
		}
	}
	return out
}

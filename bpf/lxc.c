// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * lxc.c: the programs on every pod's host-side veth.
 *
 * from_container (tcx ingress) sees every packet a pod sends:
 *
 *   ARP          -> answered here (arp.h)
 *   IPv4 of a flow the stack NATed -> the stack, to reverse it (nfct.h)
 *   IPv4 carrying the node's identity option -> dropped (nativeid.h)
 *   IPv4, denied by policy -> dropped, or answered if a Reject rule
 *                  denied it (conntrack.h, reject.h)
 *   IPv4, local  -> straight into the destination pod (endpoint.h)
 *   IPv4, remote -> to the owning node, overlay or FIB (tunnel.h), with
 *                  the sender's identity in the VNI or an IPv4 option
 *   IPv4, other  -> the node's stack (node addresses, masquerade to outside)
 *   IPv6 neighbour discovery -> the node's stack (podlink.h)
 *   anything else, and any tagged frame -> dropped (podlink.h)
 *
 * to_container (tcx egress) sees what the node's stack delivers to the pod:
 * traffic from the node itself and flows the stack translated. Packets
 * Weir delivers itself skip it (redirect_peer), having been judged already.
 */
#include "lib/common.h"
#include "lib/arp.h"
#include "lib/conntrack.h"
#include "lib/endpoint.h"
#include "lib/nativeid.h"
#include "lib/nfct.h"
#include "lib/podlink.h"
#include "lib/reject.h"
#include "lib/tunnel.h"

char __license[] SEC("license") = "Dual BSD/GPL";

static __always_inline int handle_ipv4(struct __sk_buff *skb)
{
	const struct endpoint_info *src, *dst;
	const struct tunnel_info *remote;
	struct iphdr *ip = ipv4_hdr(skb);
	int verdict, opens = 0;

	if (!ip) {
		metric_inc(METRIC_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}

	/* A pod may only send from the addresses it was given. */
	src = endpoint_lookup_v4(ip->saddr);
	if (!src || src->ifindex != skb->ingress_ifindex) {
		metric_inc(METRIC_DROP_SPOOF);
		return TC_ACT_SHOT;
	}

	/* The identity option is a node's word, never a pod's (nativeid.h). */
	if (nativeid_forged(skb, ip, sizeof(struct ethhdr))) {
		metric_inc(METRIC_DROP_IDENTITY_OPTION);
		return TC_ACT_SHOT;
	}

	if (podlink_group_v4(ip->daddr)) {
		metric_inc(METRIC_DROP_BROADCAST);
		return TC_ACT_SHOT;
	}

	dst = endpoint_lookup_v4(ip->daddr);
	remote = dst ? NULL : tunnel_lookup_v4(ip->daddr);
	if ((dst || remote) && nfct_stack_translated(skb, ip, sizeof(struct ethhdr)))
		return TC_ACT_OK;
	verdict = ct_policy_v4_opens(skb, ip, sizeof(struct ethhdr), NULL, &opens, 1);
	if (verdict == CT_POLICY_REJECT)
		return reject_v4(skb, sizeof(struct ethhdr));
	if (verdict != TC_ACT_OK)
		return TC_ACT_SHOT;
	if (dst)
		return endpoint_deliver(skb, dst);
	if (remote)
		return tunnel_forward_v4(skb, ip, remote, label_identity_v4(ip->saddr), opens);

	metric_inc(METRIC_PASS_HOST);
	return TC_ACT_OK;
}

SEC("tcx/ingress")
int from_container(struct __sk_buff *skb)
{
	__be16 proto = eth_proto(skb);

	if (podlink_tagged(skb, proto)) {
		metric_inc(METRIC_DROP_VLAN);
		return TC_ACT_SHOT;
	}
	switch (proto) {
	case bpf_htons(ETH_P_ARP):
		return arp_respond(skb);
	case bpf_htons(ETH_P_IP):
		return handle_ipv4(skb);
	case bpf_htons(ETH_P_IPV6):
		return podlink_ipv6(skb);
	default:
		metric_inc(METRIC_DROP_ETHERTYPE);
		return TC_ACT_SHOT;
	}
}

SEC("tcx/egress")
int to_container(struct __sk_buff *skb)
{
	struct iphdr *ip;

	if (eth_proto(skb) != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	ip = ipv4_hdr(skb);
	if (!ip) {
		metric_inc(METRIC_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	/* The sender is the node's stack: a reject is a silent drop here. */
	return ct_policy_v4(skb, ip, sizeof(struct ethhdr), NULL) == TC_ACT_OK ? TC_ACT_OK : TC_ACT_SHOT;
}

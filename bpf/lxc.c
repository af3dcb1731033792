// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * lxc.c: from_container, attached to tcx ingress of every pod's host-side
 * veth, so it sees every packet a pod sends.
 *
 *   ARP          -> answered here (arp.h)
 *   IPv4, local  -> straight into the destination pod (endpoint.h)
 *   IPv4, remote -> to the owning node, overlay or FIB (tunnel.h)
 *   IPv4 of a flow the stack NATed -> the stack, to reverse it (nfct.h)
 *   anything else-> the node's stack (node addresses, masquerade to outside)
 */
#include "lib/common.h"
#include "lib/arp.h"
#include "lib/endpoint.h"
#include "lib/nfct.h"
#include "lib/tunnel.h"

char __license[] SEC("license") = "Dual BSD/GPL";

static __always_inline int handle_ipv4(struct __sk_buff *skb)
{
	const struct endpoint_info *src, *dst;
	const struct tunnel_info *remote;
	struct iphdr *ip = ipv4_hdr(skb);

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

	dst = endpoint_lookup_v4(ip->daddr);
	remote = dst ? NULL : tunnel_lookup_v4(ip->daddr);
	if ((dst || remote) && nfct_stack_translated(skb, ip, sizeof(struct ethhdr)))
		return TC_ACT_OK;
	if (dst)
		return endpoint_deliver(skb, dst);
	if (remote)
		return tunnel_forward_v4(skb, ip, remote);

	metric_inc(METRIC_PASS_HOST);
	return TC_ACT_OK;
}

SEC("tcx/ingress")
int from_container(struct __sk_buff *skb)
{
	switch (eth_proto(skb)) {
	case bpf_htons(ETH_P_ARP):
		return arp_respond(skb);
	case bpf_htons(ETH_P_IP):
		return handle_ipv4(skb);
	default:
		/* IPv6 and the rest take the host path until dual-stack lands. */
		metric_inc(METRIC_PASS_HOST);
		return TC_ACT_OK;
	}
}

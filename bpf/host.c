// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * host.c: from_netdev, attached to tcx ingress of the node's underlay device
 * in native-routing mode. Packets another node routed to one of our pods go
 * straight into the pod once its ingress policy allows (conntrack.h);
 * everything else continues into the node's stack.
 */
#include "lib/common.h"
#include "lib/conntrack.h"
#include "lib/endpoint.h"
#include "lib/nfct.h"
#include "lib/reject.h"

char __license[] SEC("license") = "Dual BSD/GPL";

SEC("tcx/ingress")
int from_netdev(struct __sk_buff *skb)
{
	const struct endpoint_info *ep;
	struct iphdr *ip;
	int verdict;

	if (eth_proto(skb) != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	ip = ipv4_hdr(skb);
	if (!ip)
		return TC_ACT_OK; /* not ours to judge: the stack drops bad headers */
	ep = endpoint_lookup_v4(ip->daddr);
	if (ep && !nfct_stack_translated(skb, ip, sizeof(struct ethhdr))) {
		verdict = ct_policy_v4(skb, ip, sizeof(struct ethhdr));
		if (verdict == CT_POLICY_REJECT)
			return reject_v4(skb, sizeof(struct ethhdr));
		if (verdict != TC_ACT_OK)
			return TC_ACT_SHOT;
		return endpoint_deliver(skb, ep);
	}
	return TC_ACT_OK;
}

/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * arp.h: answering a pod's ARP requests without a bridge or proxy_arp.
 *
 * A pod routes everything through one gateway address. Its ARP request for
 * that address reaches the host-side veth, where this responder turns the
 * frame around in place into a reply carrying the veth's MAC.
 */
#ifndef WEIR_LIB_ARP_H
#define WEIR_LIB_ARP_H

#include "endpoint.h"

/* Spelled out here: linux/if_arp.h drags in the C library headers. */
#define ARPHRD_ETHER 1
#define ARPOP_REQUEST 1
#define ARPOP_REPLY 2

struct arp_hdr {
	__be16 ar_hrd;
	__be16 ar_pro;
	__u8 ar_hln;
	__u8 ar_pln;
	__be16 ar_op;
};

struct arp_eth_ipv4 {
	struct arp_hdr hdr;
	__u8 sha[ETH_ALEN];
	__be32 sip;
	__u8 tha[ETH_ALEN];
	__be32 tip;
} __attribute__((packed));

/*
 * arp_respond answers an IPv4-over-Ethernet request sent by the pod that owns
 * the sender address. Requests for the pod's own address (duplicate address
 * detection) and anything else are dropped: the pod has no other L2 peer.
 */
__always_inline_fn int arp_respond(struct __sk_buff *skb)
{
	struct ethhdr *eth = (void *)(long)skb->data;
	struct arp_eth_ipv4 *arp = (void *)(eth + 1);
	const struct endpoint_info *ep;
	struct arp_eth_ipv4 reply;
	__u8 smac[ETH_ALEN];

	if (!ctx_data_ok(skb, 0, sizeof(*eth) + sizeof(*arp)))
		goto malformed;
	if (arp->hdr.ar_hrd != bpf_htons(ARPHRD_ETHER) || arp->hdr.ar_pro != bpf_htons(ETH_P_IP) ||
	    arp->hdr.ar_hln != ETH_ALEN || arp->hdr.ar_pln != 4)
		goto malformed;
	if (arp->hdr.ar_op != bpf_htons(ARPOP_REQUEST) || arp->tip == arp->sip)
		return TC_ACT_SHOT;

	ep = endpoint_lookup_v4(arp->sip);
	if (!ep || ep->ifindex != skb->ingress_ifindex) {
		metric_inc(METRIC_DROP_SPOOF);
		return TC_ACT_SHOT;
	}

	__builtin_memcpy(smac, arp->sha, ETH_ALEN);
	reply.hdr = arp->hdr;
	reply.hdr.ar_op = bpf_htons(ARPOP_REPLY);
	__builtin_memcpy(reply.sha, ep->node_mac, ETH_ALEN);
	reply.sip = arp->tip;
	__builtin_memcpy(reply.tha, smac, ETH_ALEN);
	reply.tip = arp->sip;

	if (bpf_skb_store_bytes(skb, sizeof(*eth), &reply, sizeof(reply), 0) < 0)
		goto malformed;
	if (eth_rewrite(skb, ep->node_mac, smac) < 0)
		goto malformed;
	metric_inc(METRIC_ARP_REPLY);
	/* Back out of the same veth: egress of the host side is ingress of the pod. */
	return bpf_redirect(skb->ingress_ifindex, 0);

malformed:
	metric_inc(METRIC_DROP_MALFORMED);
	return TC_ACT_SHOT;
}

#endif /* WEIR_LIB_ARP_H */

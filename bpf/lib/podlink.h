/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * podlink.h: which frames a pod may put on its link at all.
 *
 * Until dual-stack lands a pod speaks IPv4 and ARP, and the node's stack
 * answers the IPv6 neighbour discovery the link needs. Everything else a
 * pod sends would reach the node's stack unjudged by policy: IPv6 to the
 * node's link-local address on the veth (its listeners answer there),
 * router advertisements that give the node a route through the pod (the
 * CVE-2020-10749 class), redirects, and IPv4 behind VLAN tags, which the
 * stack strips after tcx and hands to ip_rcv with any source address, and
 * IPv4 broadcast and multicast, which the node's listeners take as their
 * own. So these are dropped here, each counted by its reason.
 */
#ifndef WEIR_LIB_PODLINK_H
#define WEIR_LIB_PODLINK_H

#include "common.h"
#include "metrics.h"

#ifndef ETH_P_IPV6
#define ETH_P_IPV6 0x86DD
#endif
#define ETH_P_8021Q_TAG 0x8100
#define ETH_P_8021AD_TAG 0x88A8

#define IPV6_HDR_LEN 40
#define IPV6_NEXTHDR_ICMP 58
#define ICMPV6_NEIGH_SOLICIT 135
#define ICMPV6_NEIGH_ADVERT 136
/* RFC 4861 7.1.1: a neighbour discovery message arrives with hop limit 255,
 * so it cannot have been forwarded. */
#define ND_HOP_LIMIT 255

/*
 * podlink_tagged reports a frame that carries or carried a VLAN tag. The
 * stack pops the outer tag before tcx runs and keeps it in the skb; an
 * inner tag is still in the frame.
 */
__always_inline_fn int podlink_tagged(struct __sk_buff *skb, __be16 proto)
{
	return skb->vlan_present || proto == bpf_htons(ETH_P_8021Q_TAG) ||
	       proto == bpf_htons(ETH_P_8021AD_TAG);
}

/*
 * podlink_ipv6 lets only neighbour solicitations and advertisements on to
 * the node: no extension headers, hop limit 255. Router solicitations and
 * advertisements, redirects, MLD and every other IPv6 packet are dropped.
 */
__always_inline_fn int podlink_ipv6(struct __sk_buff *skb)
{
	__u8 *ip6 = (void *)(long)skb->data + sizeof(struct ethhdr);
	__u8 type;

	if (!ctx_data_ok(skb, sizeof(struct ethhdr), IPV6_HDR_LEN + 4))
		goto drop;
	/* version 6; next header (byte 6) ICMPv6; hop limit (byte 7) 255 */
	if ((ip6[0] >> 4) != 6 || ip6[6] != IPV6_NEXTHDR_ICMP || ip6[7] != ND_HOP_LIMIT)
		goto drop;
	type = ip6[IPV6_HDR_LEN];
	if (type != ICMPV6_NEIGH_SOLICIT && type != ICMPV6_NEIGH_ADVERT)
		goto drop;
	metric_inc(METRIC_PASS_HOST);
	return TC_ACT_OK;
drop:
	metric_inc(METRIC_DROP_IPV6);
	return TC_ACT_SHOT;
}

/*
 * podlink_group_v4 reports IPv4 to the limited broadcast address or a
 * multicast group: the node's stack would take it as its own, judged as
 * "world" rather than the node, and no pod has a group to reach.
 */
__always_inline_fn int podlink_group_v4(__be32 daddr)
{
	return daddr == bpf_htonl(0xffffffff) || (daddr & bpf_htonl(0xf0000000)) == bpf_htonl(0xe0000000);
}

#endif /* WEIR_LIB_PODLINK_H */

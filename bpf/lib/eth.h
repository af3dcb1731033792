/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* eth.h: Ethernet header helpers. */
#ifndef WEIR_LIB_ETH_H
#define WEIR_LIB_ETH_H

#include "common.h"

/*
 * eth_rewrite sets the source and destination MAC addresses. It writes the
 * packet directly rather than through bpf_skb_store_bytes: the kernel makes
 * the header writable once in the program's prologue, and two 6-byte
 * stores cost less than two helper calls on the per-packet path.
 */
__always_inline_fn int eth_rewrite(struct __sk_buff *skb, const __u8 *src, const __u8 *dst)
{
	struct ethhdr *eth = (void *)(long)skb->data;

	if (!ctx_data_ok(skb, 0, sizeof(*eth)))
		return -1;
	__builtin_memcpy(eth->h_source, src, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, dst, ETH_ALEN);
	return 0;
}

/* eth_proto returns the EtherType in network order, or 0 if truncated. */
__always_inline_fn __be16 eth_proto(struct __sk_buff *skb)
{
	struct ethhdr *eth = (void *)(long)skb->data;

	if (!ctx_data_ok(skb, 0, sizeof(*eth)))
		return 0;
	return eth->h_proto;
}

/* ipv4_hdr returns the IPv4 header after the Ethernet header, or NULL. */
__always_inline_fn struct iphdr *ipv4_hdr(struct __sk_buff *skb)
{
	struct iphdr *ip = (void *)(long)skb->data + sizeof(struct ethhdr);

	if (!ctx_data_ok(skb, sizeof(struct ethhdr), sizeof(*ip)))
		return NULL;
	if (ip->version != 4 || ip->ihl < 5)
		return NULL;
	return ip;
}

#endif /* WEIR_LIB_ETH_H */

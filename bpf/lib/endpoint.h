/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * endpoint.h: the local endpoint map and delivery into a pod.
 *
 * weir_endpoints: hash, key struct weir_addr (a pod address on this node),
 * value struct endpoint_info. The agent writes an entry after the pod's veth
 * is fully plumbed and deletes it before the veth goes away, so a hit always
 * names a live host-side interface.
 */
#ifndef WEIR_LIB_ENDPOINT_H
#define WEIR_LIB_ENDPOINT_H

#include "addr.h"
#include "eth.h"
#include "metrics.h"

struct endpoint_info {
	__u32 ifindex;    /* host-side veth of the pod */
	__u32 flags;      /* reserved */
	__u8 mac[6];      /* the pod's eth0 address */
	__u8 node_mac[6]; /* the host-side veth address, the pod's gateway MAC */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct weir_addr);
	__type(value, struct endpoint_info);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_endpoints SEC(".maps");

__always_inline_fn struct endpoint_info *endpoint_lookup_v4(__be32 ip)
{
	struct weir_addr key;

	weir_addr_from_v4(&key, ip);
	return bpf_map_lookup_elem(&weir_endpoints, &key);
}

/*
 * endpoint_deliver hands the packet straight into the pod's namespace: the
 * MACs are rewritten as a router would, then redirect_peer switches to the
 * veth peer without a trip through the host's backlog queue.
 */
__always_inline_fn int endpoint_deliver(struct __sk_buff *skb, const struct endpoint_info *ep)
{
	if (eth_rewrite(skb, ep->node_mac, ep->mac) < 0) {
		metric_inc(METRIC_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	/* A frame from the overlay carried another node's MAC; it is ours now. */
	if (skb->pkt_type != PACKET_HOST)
		bpf_skb_change_type(skb, PACKET_HOST);
	metric_inc(METRIC_REDIRECT_LOCAL);
	return bpf_redirect_peer(ep->ifindex, 0);
}

#endif /* WEIR_LIB_ENDPOINT_H */

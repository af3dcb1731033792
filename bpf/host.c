// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * host.c: from_netdev, attached to tcx ingress of the node's underlay device
 * in native-routing mode. Packets another node routed to one of our pods go
 * straight into the pod once its ingress policy allows (conntrack.h);
 * everything else continues into the node's stack.
 *
 * A packet for a local pod is refused when its source could not have sent
 * it from where it came: this node's own pod addresses never arrive from
 * the underlay, and a peer's pod address only from that peer, checked as a
 * strict reverse-path filter (the route back to the source leaves through
 * this device, towards the MAC the frame came from). Native routing has no
 * field to carry the sender's identity: pods are judged by the ipcache, and
 * a pod address it does not know yet is unidentified (identity.h).
 */
#include "lib/common.h"
#include "lib/conntrack.h"
#include "lib/endpoint.h"
#include "lib/nfct.h"
#include "lib/reject.h"
#include "lib/tunnel.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/*
 * netdev_sender_ok: the route to a peer pod's node must leave through the
 * device the packet arrived on, towards the frame's source MAC. A
 * neighbour not resolved yet cannot be compared; the route alone holds.
 */
static __always_inline int netdev_sender_ok(struct __sk_buff *skb, struct iphdr *ip)
{
	struct ethhdr *eth = (void *)(long)skb->data;
	const struct tunnel_info *owner;
	struct bpf_fib_lookup fib = {};
	long rc;

	owner = tunnel_lookup_v4(ip->saddr);
	if (!owner || SENDER_FROM_CB)
		return 1; /* no pod: judged by its address; or a trace */
	if (owner->node.family != WEIR_AF_INET || !ctx_data_ok(skb, 0, sizeof(*eth)))
		return 0;
	fib.family = WEIR_AF_INET;
	fib.ipv4_dst = ip->saddr;
	fib.ifindex = skb->ingress_ifindex;
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH)
		return fib.ifindex == skb->ingress_ifindex && tunnel_owner_is(owner, fib.ipv4_dst);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS || fib.ifindex != skb->ingress_ifindex ||
	    !tunnel_owner_is(owner, fib.ipv4_dst))
		return 0;
	return __builtin_memcmp(fib.dmac, eth->h_source, ETH_ALEN) == 0;
}

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
	/* This node's pods never arrive from the underlay, whatever the destination. */
	if (in_pod_cidr_v4(ip->saddr) || endpoint_lookup_v4(ip->saddr))
		goto bad_sender;
	ep = endpoint_lookup_v4(ip->daddr);
	if (!ep)
		return TC_ACT_OK;
	if (!netdev_sender_ok(skb, ip))
		goto bad_sender;
	if (nfct_stack_translated(skb, ip, sizeof(struct ethhdr)))
		return TC_ACT_OK;
	verdict = ct_policy_v4(skb, ip, sizeof(struct ethhdr), NULL);
	if (verdict == CT_POLICY_REJECT)
		return reject_v4(skb, sizeof(struct ethhdr));
	if (verdict != TC_ACT_OK)
		return TC_ACT_SHOT;
	return endpoint_deliver(skb, ep);

bad_sender:
	metric_inc(METRIC_DROP_TUNNEL_SOURCE);
	return TC_ACT_SHOT;
}

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * host.c: from_netdev and to_netdev, attached to tcx ingress and egress
 * of the node's underlay device in both routing modes.
 *
 * Every IPv4 packet from the underlay is refused when its source could not
 * have sent it from where it came: this node's own pod addresses and its
 * own address never arrive from outside; a pod address only from the hop
 * towards the node that owns its CIDR, and no pod address that no node is
 * known to own; another node's address only from the hop towards it. The
 * hop is checked as a strict reverse-path filter: the route leaves through
 * this device, towards the MAC the frame came from (once the neighbour is
 * resolved). In VXLAN mode pod traffic between nodes takes the overlay,
 * but a pod's packets to another node's own address take the underlay.
 *
 * In native-routing mode, packets another node routed to one of our pods
 * then go straight into the pod once its ingress policy allows
 * (conntrack.h); everything else continues into the node's stack. A peer's
 * pod's packet that opens a flow carries its identity in an IPv4 option
 * its node added (nativeid.h): it is read and stripped here, and judges
 * the pod from its first packet. Without one, pods are judged by the
 * ipcache, and a pod address it does not know yet is unidentified
 * (identity.h).
 *
 * With no kube-proxy beside Weir, a packet from outside to a NodePort,
 * external IP or load balancer IP is translated to its backend before the
 * stack routes it, and to_netdev gives the replies the Service address
 * back (nodeport.h).
 */
#include "lib/common.h"
#include "lib/conntrack.h"
#include "lib/endpoint.h"
#include "lib/nativeid.h"
#include "lib/nfct.h"
#include "lib/nodeport.h"
#include "lib/reject.h"
#include "lib/tunnel.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* netdev_from_hop reports whether the frame came from the hop this node's
 * route towards node (network order) leaves through. */
static __always_inline int netdev_from_hop(struct __sk_buff *skb, __be32 node)
{
	struct ethhdr *eth = (void *)(long)skb->data;
	struct bpf_fib_lookup fib = {};
	long rc;

	if (SENDER_FROM_CB)
		return 1; /* a trace: the owner sent it */
	if (!ctx_data_ok(skb, 0, sizeof(*eth)))
		return 0;
	fib.family = WEIR_AF_INET;
	fib.ipv4_dst = node;
	fib.ifindex = skb->ingress_ifindex;
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH)
		return fib.ifindex == skb->ingress_ifindex;
	if (rc != BPF_FIB_LKUP_RET_SUCCESS || fib.ifindex != skb->ingress_ifindex)
		return 0;
	return __builtin_memcmp(fib.dmac, eth->h_source, ETH_ALEN) == 0;
}

/* What netdev_sender_ok found the sender to be. */
enum netdev_sender {
	SENDER_REFUSED = 0,
	SENDER_OK,       /* a node, the world: judged by its address */
	SENDER_PEER_POD, /* a peer's pod, from the hop towards its node */
};

/* netdev_sender_ok: see the top of this file. */
static __always_inline enum netdev_sender netdev_sender_ok(struct __sk_buff *skb, struct iphdr *ip)
{
	const struct tunnel_info *owner;
	__be32 node;
	__u32 id;

	if (in_pod_cidr_v4(ip->saddr) || endpoint_lookup_v4(ip->saddr))
		return SENDER_REFUSED;
	owner = tunnel_lookup_v4(ip->saddr);
	if (owner) {
		if (owner->node.family != WEIR_AF_INET)
			return SENDER_REFUSED;
		__builtin_memcpy(&node, owner->node.addr, sizeof(node));
		return netdev_from_hop(skb, node) ? SENDER_PEER_POD : SENDER_REFUSED;
	}
	if (in_cluster_cidr_v4(ip->saddr))
		return SENDER_REFUSED;
	id = ipcache_identity_v4(ip->saddr);
	if (id == IDENTITY_HOST)
		return SENDER_REFUSED;
	if (id == IDENTITY_REMOTE_NODE)
		return netdev_from_hop(skb, ip->saddr) ? SENDER_OK : SENDER_REFUSED;
	return SENDER_OK; /* the world: judged by its address */
}

/*
 * netdev_take_identity strips the identity option a peer's pod's packet
 * carries and fills hint with it (nativeid.h). It returns the packet's
 * IPv4 header again, or NULL when the packet must be dropped.
 */
static __always_inline struct iphdr *netdev_take_identity(struct __sk_buff *skb, struct iphdr *ip,
							  struct identity_hint *hint)
{
	__be32 saddr = ip->saddr;
	__u32 id;

	if (nativeid_take(skb, ip, sizeof(struct ethhdr), &id) < 0) {
		metric_inc(METRIC_DROP_IDENTITY_OPTION);
		return NULL;
	}
	ip = ipv4_hdr(skb);
	if (!ip) {
		metric_inc(METRIC_DROP_MALFORMED);
		return NULL;
	}
	if (id) {
		hint->addr = saddr;
		hint->id = vouched_pod_identity(id);
		metric_inc(METRIC_IDENTITY_OPTION_READ);
	}
	return ip;
}

SEC("tcx/ingress")
int from_netdev(struct __sk_buff *skb)
{
	struct identity_hint hint = {};
	const struct endpoint_info *ep;
	enum netdev_sender sender;
	struct iphdr *ip;
	int verdict;

	if (eth_proto(skb) != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	ip = ipv4_hdr(skb);
	if (!ip)
		return TC_ACT_OK; /* not ours to judge: the stack drops bad headers */
	sender = netdev_sender_ok(skb, ip);
	if (sender == SENDER_REFUSED) {
		metric_inc(METRIC_DROP_TUNNEL_SOURCE);
		return TC_ACT_SHOT;
	}
	if (TUNNEL_MODE == WEIR_MODE_NATIVE && sender == SENDER_PEER_POD) {
		ip = netdev_take_identity(skb, ip, &hint);
		if (!ip)
			return TC_ACT_SHOT;
	}
	/* A peer's pod reaches Services through its own node's sockets, which
	 * leave this node's externalTrafficPolicy: Local NodePort to this node
	 * when it has no endpoint: dropped here, as for a client outside
	 * (nodeport_pick). Its packets to pods (native routing) are no
	 * Service's and skip the lookup. */
	switch (sender == SENDER_PEER_POD && in_cluster_cidr_v4(ip->daddr) ? NODEPORT_NOT_OURS
		: nodeport_v4(skb, ip, sizeof(struct ethhdr), sender == SENDER_PEER_POD)) {
	case NODEPORT_TRANSLATED:
		return TC_ACT_OK; /* the stack routes it, and sees the flow */
	case NODEPORT_DROP:
		metric_inc(METRIC_DROP_NODEPORT);
		return TC_ACT_SHOT;
	default:
		break;
	}
	if (TUNNEL_MODE != WEIR_MODE_NATIVE)
		return TC_ACT_OK;
	ep = endpoint_lookup_v4(ip->daddr);
	if (!ep || nfct_stack_translated(skb, ip, sizeof(struct ethhdr)))
		return TC_ACT_OK;
	verdict = ct_policy_v4(skb, ip, sizeof(struct ethhdr), &hint);
	if (verdict == CT_POLICY_REJECT)
		return reject_v4(skb, sizeof(struct ethhdr));
	if (verdict != TC_ACT_OK)
		return TC_ACT_SHOT;
	return endpoint_deliver(skb, ep);
}

SEC("tcx/egress")
int to_netdev(struct __sk_buff *skb)
{
	struct iphdr *ip;

	if (eth_proto(skb) != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	ip = ipv4_hdr(skb);
	if (!ip)
		return TC_ACT_OK;
	if (nodeport_reverse_v4(skb, ip, sizeof(struct ethhdr)) < 0) {
		metric_inc(METRIC_DROP_NODEPORT);
		return TC_ACT_SHOT;
	}
	return TC_ACT_OK;
}

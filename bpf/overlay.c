// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * overlay.c: the node's collect-metadata VXLAN device.
 *
 * from_overlay (tcx ingress) takes packets only from peer nodes, and a pod
 * address as source only from the node that owns the pod's CIDR (never
 * this node's own): whoever else reaches the VXLAN port cannot speak as a
 * pod. It delivers decapsulated packets for local pods straight into them
 * once their ingress policy allows (conntrack.h), judged with the identity
 * the sending node put in the VNI (tunnel.h), unless the stack must
 * reverse its NAT (nfct.h; to_container judges those), and marks the rest
 * as addressed to this host: the inner frame carries the sending node's
 * MAC, which the stack would otherwise drop.
 *
 * to_overlay (tcx egress) gives packets the host itself routes into the
 * device (node to remote pod) the tunnel key that from_container sets for
 * pod traffic, with the host's identity; without it the device has nowhere
 * to send them.
 */
#include "lib/common.h"
#include "lib/conntrack.h"
#include "lib/endpoint.h"
#include "lib/nfct.h"
#include "lib/reject.h"
#include "lib/tunnel.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/*
 * overlay_node_source_ok judges an inner source that is no known pod: a
 * pod address no node owns, this node's own address, or another node's
 * than the sender's would let a peer speak with an identity it does not
 * have (host is let in everywhere).
 */
static __always_inline int overlay_node_source_ok(__be32 saddr, __be32 outer)
{
	__u32 id;

	if (in_cluster_cidr_v4(saddr))
		return 0;
	id = ipcache_identity_v4(saddr);
	if (id == IDENTITY_HOST)
		return 0;
	return id != IDENTITY_REMOTE_NODE || saddr == outer;
}

/*
 * overlay_sender_ok checks the inner source against the node that sent
 * the packet (outer source, network order) and fills hint with the
 * identity that node vouches for. A source that is no pod address (the
 * node itself, traffic it forwards) is judged by its address alone.
 */
static __always_inline int overlay_sender_ok(__be32 saddr, __be32 outer, __u32 vni, struct identity_hint *hint)
{
	const struct tunnel_info *owner;

	if (in_pod_cidr_v4(saddr) || endpoint_lookup_v4(saddr))
		return 0; /* this node's pods never arrive from the overlay */
	if (SENDER_FROM_CB && !outer)
		return 1; /* a trace: the owner sent it, the ipcache names it */
	if (!tunnel_peer_node_v4(outer))
		return 0;
	owner = tunnel_lookup_v4(saddr);
	if (!owner)
		return overlay_node_source_ok(saddr, outer);
	if (!tunnel_owner_is(owner, outer))
		return 0;
	hint->addr = saddr;
	hint->id = vouched_pod_identity(vni);
	return 1;
}

/* overlay_sender reads the sending node (network order) and the VNI. */
static __always_inline int overlay_sender(struct __sk_buff *skb, __be32 *outer, __u32 *vni)
{
	struct bpf_tunnel_key key = {};

	if (SENDER_FROM_CB) {
		/* volatile: the verifier takes only a constant offset from ctx */
		*outer = *(volatile __u32 *)&skb->cb[0];
		*vni = *(volatile __u32 *)&skb->cb[1];
		return 0;
	}
	if (bpf_skb_get_tunnel_key(skb, &key, sizeof(key), 0) < 0)
		return -1;
	*outer = bpf_htonl(key.remote_ipv4);
	*vni = key.tunnel_id;
	return 0;
}

SEC("tcx/ingress")
int from_overlay(struct __sk_buff *skb)
{
	struct identity_hint hint = {};
	const struct endpoint_info *ep;
	struct iphdr *ip;
	__be32 outer;
	__u32 vni;
	int verdict;

	if (overlay_sender(skb, &outer, &vni) < 0)
		goto bad_sender;
	if (eth_proto(skb) != bpf_htons(ETH_P_IP)) {
		/* Peers send IPv4 only until dual-stack lands. */
		metric_inc(METRIC_DROP_ETHERTYPE);
		return TC_ACT_SHOT;
	}
	ip = ipv4_hdr(skb);
	if (!ip) {
		metric_inc(METRIC_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	if (!overlay_sender_ok(ip->saddr, outer, vni, &hint))
		goto bad_sender;
	ep = endpoint_lookup_v4(ip->daddr);
	if (ep && !nfct_stack_translated(skb, ip, sizeof(struct ethhdr))) {
		verdict = ct_policy_v4(skb, ip, sizeof(struct ethhdr), &hint);
		if (verdict == CT_POLICY_REJECT)
			return reject_v4(skb, sizeof(struct ethhdr)); /* back through the tunnel */
		if (verdict != TC_ACT_OK)
			return TC_ACT_SHOT;
		return endpoint_deliver(skb, ep);
	}

	if (skb->pkt_type == PACKET_OTHERHOST)
		bpf_skb_change_type(skb, PACKET_HOST);
	metric_inc(METRIC_PASS_HOST);
	return TC_ACT_OK;

bad_sender:
	metric_inc(METRIC_DROP_TUNNEL_SOURCE);
	return TC_ACT_SHOT;
}

SEC("tcx/egress")
int to_overlay(struct __sk_buff *skb)
{
	const struct tunnel_info *remote;
	struct bpf_tunnel_key key;
	struct iphdr *ip;

	/* Pod traffic arrives here with its key already set by from_container. */
	if (bpf_skb_get_tunnel_key(skb, &key, sizeof(key), 0) == 0)
		return TC_ACT_OK;

	if (eth_proto(skb) != bpf_htons(ETH_P_IP))
		return TC_ACT_SHOT;
	ip = ipv4_hdr(skb);
	if (!ip) {
		metric_inc(METRIC_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	remote = tunnel_lookup_v4(ip->daddr);
	/* What the stack routes here is the node's own, or a pod's that the
	 * stack translated (kube-proxy): a pod keeps its identity. */
	if (!remote || tunnel_set_key(skb, remote, endpoint_lookup_v4(ip->saddr) ? label_identity_v4(ip->saddr)
										  : IDENTITY_HOST) < 0) {
		metric_inc(METRIC_DROP_TUNNEL);
		return TC_ACT_SHOT;
	}
	metric_inc(METRIC_REDIRECT_TUNNEL);
	return TC_ACT_OK;
}

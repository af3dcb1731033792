// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * overlay.c: the node's collect-metadata VXLAN device.
 *
 * from_overlay (tcx ingress) delivers decapsulated packets for local pods
 * straight into them once their ingress policy allows (conntrack.h), unless
 * the stack must reverse its NAT (nfct.h; to_container judges those), and
 * marks the rest as addressed to this host: the inner frame carries the
 * sending node's MAC, which the stack would otherwise drop.
 *
 * to_overlay (tcx egress) gives packets the host itself routes into the
 * device (node to remote pod) the tunnel key that from_container sets for
 * pod traffic; without it the device has nowhere to send them.
 */
#include "lib/common.h"
#include "lib/conntrack.h"
#include "lib/endpoint.h"
#include "lib/nfct.h"
#include "lib/reject.h"
#include "lib/tunnel.h"

char __license[] SEC("license") = "Dual BSD/GPL";

SEC("tcx/ingress")
int from_overlay(struct __sk_buff *skb)
{
	const struct endpoint_info *ep;
	struct iphdr *ip;
	int verdict;

	if (eth_proto(skb) != bpf_htons(ETH_P_IP))
		goto to_host;
	ip = ipv4_hdr(skb);
	if (!ip) {
		metric_inc(METRIC_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	ep = endpoint_lookup_v4(ip->daddr);
	if (ep && !nfct_stack_translated(skb, ip, sizeof(struct ethhdr))) {
		verdict = ct_policy_v4(skb, ip, sizeof(struct ethhdr));
		if (verdict == CT_POLICY_REJECT)
			return reject_v4(skb, sizeof(struct ethhdr)); /* back through the tunnel */
		if (verdict != TC_ACT_OK)
			return TC_ACT_SHOT;
		return endpoint_deliver(skb, ep);
	}

to_host:
	if (skb->pkt_type == PACKET_OTHERHOST)
		bpf_skb_change_type(skb, PACKET_HOST);
	metric_inc(METRIC_PASS_HOST);
	return TC_ACT_OK;
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
	if (!remote || tunnel_set_key(skb, remote) < 0) {
		metric_inc(METRIC_DROP_TUNNEL);
		return TC_ACT_SHOT;
	}
	metric_inc(METRIC_REDIRECT_TUNNEL);
	return TC_ACT_OK;
}

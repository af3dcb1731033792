/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * nfct.h: asking the kernel's connection tracker whether the node's stack
 * translated a flow.
 *
 * Weir delivers pod traffic past the node's stack (redirect_peer, tunnel
 * redirects). That is only right for flows the stack never saw. When the
 * stack did translate one -- kube-proxy's DNAT of a Service address, a
 * hostPort, a masquerade -- the replies must go back through the stack so
 * it can reverse the translation; delivered directly they would reach the
 * client from the backend's own address and be dropped. So before a
 * shortcut, a TCP or UDP packet is looked up in conntrack (the tuple
 * matches either direction of an entry); if the entry carries NAT, the
 * packet is handed to the stack instead.
 */
#ifndef WEIR_LIB_NFCT_H
#define WEIR_LIB_NFCT_H

#include "common.h"
#include "metrics.h"

/* Options of the conntrack kfuncs (net/netfilter/nf_conntrack_bpf.c). */
struct bpf_ct_opts {
	__s32 netns_id;
	__s32 error;
	__u8 l4proto;
	__u8 dir;
	__u16 ct_zone_id;
	__u8 ct_zone_dir;
	__u8 reserved[3];
};

#define NFCT_CURRENT_NETNS (-1)

/* Only the field read here; CO-RE finds it in the running kernel's layout. */
struct nf_conn {
	unsigned long status;
} __attribute__((preserve_access_index));

#define NFCT_IPS_SRC_NAT (1 << 4)
#define NFCT_IPS_DST_NAT (1 << 5)

extern struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *skb, struct bpf_sock_tuple *tuple,
					 __u32 tuple__sz, struct bpf_ct_opts *opts,
					 __u32 opts__sz) __ksym;
extern void bpf_ct_release(struct nf_conn *ct) __ksym;

/*
 * nfct_stack_translated reports whether ip belongs to a flow the node's
 * stack translated. ip must be a validated IPv4 header at l3_off.
 */
__always_inline_fn int nfct_stack_translated(struct __sk_buff *skb, struct iphdr *ip, __u32 l3_off)
{
	struct bpf_ct_opts opts = { .netns_id = NFCT_CURRENT_NETNS };
	struct bpf_sock_tuple tuple = {};
	struct nf_conn *ct;
	__u32 l4_off;
	__be16 *ports;
	int nat;

	if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
		return 0;
	if (ip->frag_off & bpf_htons(0x1fff)) /* no ports in a later fragment */
		return 0;
	l4_off = l3_off + (ip->ihl & 0xf) * 4;
	ports = (void *)(long)skb->data + l4_off;
	if ((void *)(ports + 2) > (void *)(long)skb->data_end)
		return 0;
	tuple.ipv4.saddr = ip->saddr;
	tuple.ipv4.daddr = ip->daddr;
	tuple.ipv4.sport = ports[0];
	tuple.ipv4.dport = ports[1];
	opts.l4proto = ip->protocol;
	ct = bpf_skb_ct_lookup(skb, &tuple, sizeof(tuple.ipv4), &opts, sizeof(opts));
	if (!ct)
		return 0;
	nat = (ct->status & (NFCT_IPS_SRC_NAT | NFCT_IPS_DST_NAT)) != 0;
	bpf_ct_release(ct);
	if (nat)
		metric_inc(METRIC_PASS_STACK_NAT);
	return nat;
}

#endif /* WEIR_LIB_NFCT_H */

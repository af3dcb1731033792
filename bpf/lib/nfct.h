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
#include "frag.h"
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

/* Only the fields read here; CO-RE finds them in the running kernel's
 * layout. */
struct ip_ct_tcp {
	__u8 state;
} __attribute__((preserve_access_index));

union nf_conntrack_proto {
	struct ip_ct_tcp tcp;
} __attribute__((preserve_access_index));

struct nf_conn {
	unsigned long status;
	union nf_conntrack_proto proto;
} __attribute__((preserve_access_index));

/* enum tcp_conntrack: the states after which a TCP flow is over. */
#define NFCT_TCP_TIME_WAIT 7
#define NFCT_TCP_CLOSE 8

#define NFCT_IPS_SRC_NAT (1 << 4)
#define NFCT_IPS_DST_NAT (1 << 5)

extern struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *skb, struct bpf_sock_tuple *tuple,
					 __u32 tuple__sz, struct bpf_ct_opts *opts,
					 __u32 opts__sz) __ksym;
extern void bpf_ct_release(struct nf_conn *ct) __ksym;

/*
 * nfct_nat_tuple reports whether the stack translated the flow of tuple.
 * A translated TCP flow that is over (TIME_WAIT, CLOSE) claims nothing: its
 * entry outlives it by minutes, and a new connection that reuses one of its
 * tuples without the stack -- a pod calling the backend's own address from
 * the port it used for the Service address a moment before -- would
 * otherwise have its replies handed to the stack, translated back to the
 * Service address and lost, stalling the connection until the entry expires.
 */
__always_inline_fn int nfct_nat_tuple(struct __sk_buff *skb, struct bpf_sock_tuple *tuple, __u8 proto)
{
	struct bpf_ct_opts opts = { .netns_id = NFCT_CURRENT_NETNS, .l4proto = proto };
	struct nf_conn *ct;
	int nat;

	ct = bpf_skb_ct_lookup(skb, tuple, sizeof(tuple->ipv4), &opts, sizeof(opts));
	if (!ct)
		return 0;
	nat = (ct->status & (NFCT_IPS_SRC_NAT | NFCT_IPS_DST_NAT)) != 0;
	if (nat && proto == IPPROTO_TCP) {
		__u8 state = ct->proto.tcp.state;

		if (state == NFCT_TCP_TIME_WAIT || state == NFCT_TCP_CLOSE)
			nat = 0;
	}
	bpf_ct_release(ct);
	return nat;
}

/*
 * nfct_icmp_error_translated reports whether ip is an ICMP error about a
 * flow the stack translated: the stack must translate the quoted header
 * back before the error means anything to the pod it reaches. The quoted
 * packet went the flow's way, so its reverse is the tuple the error's
 * sender answers on.
 */
__always_inline_fn int nfct_icmp_error_translated(struct __sk_buff *skb, struct iphdr *ip, __u32 l3_off)
{
	struct bpf_sock_tuple tuple = {};
	__u32 off = l3_off + (ip->ihl & 0xf) * 4;
	struct iphdr inner;
	__be16 ports[2];
	__u8 type;

	if (frag_later_v4(ip) || bpf_skb_load_bytes(skb, off, &type, 1) < 0)
		return 0;
	if (type != 3 && type != 11 && type != 12) /* unreachable, time exceeded, parameter problem */
		return 0;
	off += 8;
	if (bpf_skb_load_bytes(skb, off, &inner, sizeof(inner)) < 0 || inner.version != 4 || inner.ihl < 5 ||
	    (inner.protocol != IPPROTO_TCP && inner.protocol != IPPROTO_UDP))
		return 0;
	if (bpf_skb_load_bytes(skb, off + (inner.ihl & 0xf) * 4, ports, sizeof(ports)) < 0)
		return 0;
	tuple.ipv4.saddr = inner.daddr;
	tuple.ipv4.daddr = inner.saddr;
	tuple.ipv4.sport = ports[1];
	tuple.ipv4.dport = ports[0];
	return nfct_nat_tuple(skb, &tuple, inner.protocol);
}

/*
 * nfct_stack_translated reports whether ip belongs to a flow the node's
 * stack translated, or is an ICMP error about one. ip must be a validated
 * IPv4 header at l3_off.
 */
__always_inline_fn int nfct_stack_translated(struct __sk_buff *skb, struct iphdr *ip, __u32 l3_off)
{
	struct bpf_sock_tuple tuple = {};
	__u32 l4_off;
	__be16 *ports;
	int nat;

	if (ip->protocol == IPPROTO_ICMP) {
		nat = nfct_icmp_error_translated(skb, ip, l3_off);
		if (nat)
			metric_inc(METRIC_PASS_STACK_NAT);
		return nat;
	}
	if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
		return 0;
	if (frag_later_v4(ip)) {
		/* No ports: it goes where its first fragment went. */
		struct frag_key fk;
		struct frag_ports *fp;

		frag_key_v4(ip, &fk);
		fp = bpf_map_lookup_elem(&weir_frags, &fk);
		return fp && fp->stack;
	}
	l4_off = l3_off + (ip->ihl & 0xf) * 4;
	ports = (void *)(long)skb->data + l4_off;
	if ((void *)(ports + 2) > (void *)(long)skb->data_end)
		return 0;
	tuple.ipv4.saddr = ip->saddr;
	tuple.ipv4.daddr = ip->daddr;
	tuple.ipv4.sport = ports[0];
	tuple.ipv4.dport = ports[1];
	nat = nfct_nat_tuple(skb, &tuple, ip->protocol);
	if (nat) {
		metric_inc(METRIC_PASS_STACK_NAT);
		if (ip->frag_off & bpf_htons(IP_MF_BIT))
			frag_record_v4(ip, ports[0], ports[1], 1);
	}
	return nat;
}

#endif /* WEIR_LIB_NFCT_H */

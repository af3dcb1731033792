/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * reject.h: answer a packet a Reject rule denies, so its sender fails at
 * once instead of timing out: a TCP reset for TCP, an ICMP destination
 * unreachable "communication administratively prohibited" (type 3, code
 * 13) for the rest.
 *
 * The packet becomes its own answer in place: the headers the answer needs
 * are read to the stack, the packet is cut (or grown) to the answer's size
 * and the answer written over it. It then goes where a packet from the
 * rejected destination to the sender would: into a local pod, or through
 * the overlay to the sender's node. A sender that is neither (the host,
 * an outside address) gets a silent drop, as does a packet that must not
 * be answered: a TCP reset, an ICMP error, a fragment, IP options.
 */
#ifndef WEIR_LIB_REJECT_H
#define WEIR_LIB_REJECT_H

#include <linux/tcp.h>

#include "common.h"
#include "endpoint.h"
#include "metrics.h"
#include "tunnel.h"

#define REJECT_TTL 64
#define ICMP_ECHO_REQUEST 8
#define ICMP_DEST_UNREACH 3
#define ICMP_PKT_FILTERED 13 /* communication administratively prohibited */
#define ICMP_QUOTE_LEN (sizeof(struct iphdr) + 8)

/* icmp_hdr is the ICMP header (linux/icmp.h pulls in libc headers). */
struct icmp_hdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	__be32 rest; /* unused for destination unreachable */
};

struct reject_tcp {
	struct iphdr ip;
	struct tcphdr tcp;
};

struct reject_icmp {
	struct iphdr ip;
	struct icmp_hdr icmp;
	__u8 quote[ICMP_QUOTE_LEN]; /* the offending IP header and 8 bytes */
};

/* csum_fold folds a 32-bit one's complement sum to the 16-bit checksum. */
__always_inline_fn __sum16 csum_fold32(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__sum16)~sum;
}

/* reject_ip fills the answer's IP header: from the rejected destination
 * back to the sender. */
__always_inline_fn void reject_ip(struct iphdr *out, const struct iphdr *in, __u8 proto, __u16 len)
{
	out->version = 4;
	out->ihl = 5;
	out->tot_len = bpf_htons(len);
	out->frag_off = bpf_htons(0x4000); /* DF */
	out->ttl = REJECT_TTL;
	out->protocol = proto;
	out->saddr = in->daddr;
	out->daddr = in->saddr;
	out->check = csum_fold32(bpf_csum_diff(NULL, 0, (__be32 *)out, sizeof(*out), 0));
}

/* reject_build_tcp writes a reset answering the TCP segment at l3_off. */
__always_inline_fn int reject_build_tcp(struct __sk_buff *skb, __u32 l3_off, const struct iphdr *in)
{
	struct {
		__be32 saddr, daddr;
		__u8 zero, proto;
		__be16 len;
	} pseudo = {};
	struct reject_tcp r = {};
	struct tcphdr th;
	__u32 seg_len, sum;

	if (bpf_skb_load_bytes(skb, l3_off + sizeof(*in), &th, sizeof(th)) < 0 || th.rst)
		return -1;
	seg_len = bpf_ntohs(in->tot_len) - sizeof(*in) - th.doff * 4 + th.syn + th.fin;
	reject_ip(&r.ip, in, IPPROTO_TCP, sizeof(r));
	r.tcp.source = th.dest;
	r.tcp.dest = th.source;
	r.tcp.doff = sizeof(r.tcp) / 4;
	r.tcp.rst = 1;
	if (th.ack) {
		r.tcp.seq = th.ack_seq;
	} else {
		r.tcp.ack = 1;
		r.tcp.ack_seq = bpf_htonl(bpf_ntohl(th.seq) + seg_len);
	}
	pseudo.saddr = r.ip.saddr;
	pseudo.daddr = r.ip.daddr;
	pseudo.proto = IPPROTO_TCP;
	pseudo.len = bpf_htons(sizeof(r.tcp));
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&pseudo, sizeof(pseudo), 0);
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&r.tcp, sizeof(r.tcp), sum);
	r.tcp.check = csum_fold32(sum);
	if (bpf_skb_change_tail(skb, l3_off + sizeof(r), 0) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, l3_off, &r, sizeof(r), 0);
}

/* reject_build_icmp writes a destination unreachable quoting the packet. */
__always_inline_fn int reject_build_icmp(struct __sk_buff *skb, __u32 l3_off, const struct iphdr *in)
{
	struct reject_icmp r = {};
	struct icmp_hdr ih;

	if (in->protocol == IPPROTO_ICMP) {
		/* Never answer an ICMP error with another. */
		if (bpf_skb_load_bytes(skb, l3_off + sizeof(*in), &ih, sizeof(ih)) < 0 || ih.type != ICMP_ECHO_REQUEST)
			return -1;
	}
	if (bpf_skb_load_bytes(skb, l3_off, r.quote, sizeof(r.quote)) < 0)
		return -1;
	reject_ip(&r.ip, in, IPPROTO_ICMP, sizeof(r));
	r.icmp.type = ICMP_DEST_UNREACH;
	r.icmp.code = ICMP_PKT_FILTERED;
	r.icmp.checksum = csum_fold32(bpf_csum_diff(NULL, 0, (__be32 *)&r.icmp, sizeof(r) - sizeof(r.ip), 0));
	if (bpf_skb_change_tail(skb, l3_off + sizeof(r), 0) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, l3_off, &r, sizeof(r), 0);
}

/*
 * reject_v4 turns the rejected packet at l3_off (an Ethernet frame) into
 * its answer and sends it to the sender. It returns the TC verdict.
 */
__always_inline_fn int reject_v4(struct __sk_buff *skb, __u32 l3_off)
{
	const struct endpoint_info *local;
	const struct tunnel_info *remote;
	struct iphdr in, *ip;
	int err;

	if (bpf_skb_load_bytes(skb, l3_off, &in, sizeof(in)) < 0 || in.ihl != 5 ||
	    (in.frag_off & bpf_htons(0x3fff)))
		goto drop;
	local = endpoint_lookup_v4(in.saddr);
	remote = local ? NULL : tunnel_lookup_v4(in.saddr);
	if (!local && !remote)
		goto drop;
	if (in.protocol == IPPROTO_TCP)
		err = reject_build_tcp(skb, l3_off, &in);
	else
		err = reject_build_icmp(skb, l3_off, &in);
	if (err < 0)
		goto drop;
	metric_inc(METRIC_POLICY_REJECT);
	if (local)
		return endpoint_deliver(skb, local);
	ip = ipv4_hdr(skb);
	if (!ip)
		goto drop;
	/* The answer is the rejecting pod's: it carries that pod's identity. */
	return tunnel_forward_v4(skb, ip, remote, label_identity_v4(ip->saddr), 1);
drop:
	metric_inc(METRIC_DROP_POLICY);
	return TC_ACT_SHOT;
}

#endif /* WEIR_LIB_REJECT_H */

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * l7.c: L7 policy on the endpoint's own sockets (issue 20), first step.
 *
 *   l7_sockops       cgroup sock_ops: an accepted socket on an L7-enforced
 *                    port joins its socket hash (lib/l7sock.h)
 *   l7_parser        stream_parser of weir_l7_strp: the message is what
 *                    has arrived (a request head's length, later)
 *   l7_verdict       stream_verdict of weir_l7_strp
 *   l7_skb_verdict   skb_verdict of weir_l7_skb
 *
 * The verdicts pass everything: this step measures what the path itself
 * costs, the gate the design must clear before any parsing is built on
 * it (bench l7gate). Nothing here drops a byte.
 */
#include "lib/common.h"
#include "lib/l7sock.h"
#include "lib/l7match.h"

char __license[] SEC("license") = "Dual BSD/GPL";

SEC("sockops")
int l7_sockops(struct bpf_sock_ops *ctx)
{
	struct l7_sock_key key = {};
	__u16 port;
	__u8 *mode;
	long err;

	if (ctx->op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB || ctx->family != WEIR_AF_INET)
		return 1;
	port = (__u16)ctx->local_port;
	mode = bpf_map_lookup_elem(&weir_l7_ports, &port);
	if (!mode)
		return 1;
	key.remote = ctx->remote_ip4;
	key.local = ctx->local_ip4;
	/* remote_port holds the port in network order in its upper half. */
	key.remote_port = bpf_ntohs((__u16)(ctx->remote_port >> 16));
	key.local_port = port;
	if (*mode == WEIR_L7_STRPARSER)
		err = bpf_sock_hash_update(ctx, &weir_l7_strp, &key, BPF_NOEXIST);
	else
		err = bpf_sock_hash_update(ctx, &weir_l7_skb, &key, BPF_NOEXIST);
	l7_count(err ? L7_STAT_JOIN_FAIL : L7_STAT_SOCKETS, 1);
	return 1;
}

SEC("sk_skb/stream_parser")
int l7_parser(struct __sk_buff *skb)
{
	return skb->len;
}

SEC("sk_skb/stream_verdict")
int l7_verdict(struct __sk_buff *skb)
{
	l7_count(L7_STAT_MESSAGES, 1);
	l7_count(L7_STAT_BYTES, skb->len);
	return SK_PASS;
}

SEC("sk_skb/verdict")
int l7_skb_verdict(struct __sk_buff *skb)
{
	l7_count(L7_STAT_MESSAGES, 1);
	l7_count(L7_STAT_BYTES, skb->len);
	return SK_PASS;
}

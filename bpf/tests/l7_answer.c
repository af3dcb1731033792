// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * tests/l7_answer.c: what an sk_skb verdict can do with a request it
 * refuses, on this kernel (TestL7AnswerFacts). Only tests load it.
 *
 * Sockets accepted on PORT join answer_hash. The verdict passes every
 * skb, except one whose first byte is:
 *   'A'  rewritten in place into an HTTP response of the same length and
 *        redirected to the socket's own egress: the client reads it, the
 *        server never sees the request;
 *   'G'  the same, after growing the skb to hold a longer response;
 *   'Z'  dropped.
 */
#include "../lib/common.h"

char __license[] SEC("license") = "Dual BSD/GPL";

struct answer_key {
	__be32 remote;
	__be32 local;
	__u16 remote_port;
	__u16 local_port;
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 64);
	__type(key, struct answer_key);
	__type(value, __u64);
} answer_hash SEC(".maps");

volatile const __u16 PORT = 0;

/* The answer: a 403 whose reason phrase pads it to the skb's length. */
static const char answer_head[] = "HTTP/1.1 403 Forbidden";
static const char answer_tail[] = "\r\nContent-Length: 0\r\n\r\n";
#define ANSWER_MIN (sizeof(answer_head) - 1 + sizeof(answer_tail) - 1)
#define ANSWER_GROWN 200

SEC("sockops")
int answer_sockops(struct bpf_sock_ops *ctx)
{
	struct answer_key k = {};

	if (ctx->op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB || ctx->family != WEIR_AF_INET || ctx->local_port != PORT)
		return 1;
	k.remote = ctx->remote_ip4;
	k.local = ctx->local_ip4;
	k.remote_port = bpf_ntohs((__u16)(ctx->remote_port >> 16));
	k.local_port = ctx->local_port;
	bpf_sock_hash_update(ctx, &answer_hash, &k, BPF_NOEXIST);
	return 1;
}

static int answer(struct __sk_buff *skb, __u32 len)
{
	char pad = ' ';
	__u32 i, tail;

	if (len < ANSWER_MIN || len > 2048)
		return -1;
	if (bpf_skb_store_bytes(skb, 0, answer_head, sizeof(answer_head) - 1, 0))
		return -1;
	tail = len - (sizeof(answer_tail) - 1);
	for (i = sizeof(answer_head) - 1; i < 2048; i++) {
		if (i >= tail)
			break;
		bpf_skb_store_bytes(skb, i, &pad, 1, 0);
	}
	return bpf_skb_store_bytes(skb, tail & 2047, answer_tail, sizeof(answer_tail) - 1, 0);
}

SEC("sk_skb")
int answer_verdict(struct __sk_buff *skb)
{
	struct answer_key k = {};
	__u32 len = skb->len;
	__u8 first = 0;

	if (bpf_skb_load_bytes(skb, 0, &first, 1))
		return SK_PASS;
	switch (first) {
	case 'Z':
		return SK_DROP;
	case 'G':
		if (len >= ANSWER_GROWN || bpf_skb_change_tail(skb, ANSWER_GROWN, 0))
			return SK_DROP;
		len = ANSWER_GROWN;
		break;
	case 'A':
		break;
	default:
		return SK_PASS;
	}
	if (answer(skb, len))
		return SK_DROP;
	k.remote = skb->remote_ip4;
	k.local = skb->local_ip4;
	k.remote_port = bpf_ntohs((__u16)(skb->remote_port >> 16));
	k.local_port = skb->local_port;
	return bpf_sk_redirect_hash(skb, &answer_hash, &k, 0);
}

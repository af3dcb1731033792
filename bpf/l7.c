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
 *   l7_http_verdict  skb_verdict of weir_l7_http: reads and judges
 *                    requests (lib/l7http.h)
 *
 * The first two verdicts pass everything: they measure what the path
 * itself costs (bench l7-gate). l7_http_verdict enforces a port's HTTP
 * set; today the set is the port's (weir_l7_ports), not yet the one
 * policy names per peer.
 */
#include "lib/common.h"
#include "lib/l7sock.h"
#include "lib/l7match.h"
#include "lib/l7http.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Per-CPU room to build a socket's reader state in: it is too large for
 * the stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct l7_conn);
} weir_l7_scratch SEC(".maps");

/* l7_track gives an accepted socket of an HTTP port its reader. A socket
 * whose state cannot be made still joins: its verdict then drops every
 * skb (closed), where not joining would hand its bytes to the
 * application unread. */
__always_inline_fn void l7_track(struct bpf_sock_ops *ctx, __u32 set)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	__u32 zero = 0;
	struct l7_conn *c = bpf_map_lookup_elem(&weir_l7_scratch, &zero);

	if (!c)
		return;
	__builtin_memset(c, 0, sizeof(*c));
	c->set = set;
	if (bpf_map_update_elem(&weir_l7_conns, &cookie, c, BPF_NOEXIST))
		l7_count(L7_STAT_JOIN_FAIL, 1);
	/* Forget the state when the socket closes (l7_sockops, STATE_CB). */
	bpf_sock_ops_cb_flags_set(ctx, BPF_SOCK_OPS_STATE_CB_FLAG);
}

/* l7_v4_mapped says whether a socket's two IPv6 addresses are
 * ::ffff:a.b.c.d. Each field is read on its own: sock_ops context fields
 * must be loaded at constant offsets. */
__always_inline_fn int l7_v4_mapped(struct bpf_sock_ops *ctx)
{
	__u32 ffff = bpf_htonl(0xffff);

	return ctx_load(ctx->remote_ip6[0]) == 0 && ctx_load(ctx->remote_ip6[1]) == 0 && ctx_load(ctx->remote_ip6[2]) == ffff &&
	       ctx_load(ctx->local_ip6[0]) == 0 && ctx_load(ctx->local_ip6[1]) == 0 && ctx_load(ctx->local_ip6[2]) == ffff;
}

SEC("sockops")
int l7_sockops(struct bpf_sock_ops *ctx)
{
	struct l7_sock_key key = {};
	struct l7_port *p;
	__u16 port;
	long err;

	if (ctx->op == BPF_SOCK_OPS_STATE_CB) {
		if (ctx->args[1] == BPF_TCP_CLOSE) {
			__u64 cookie = bpf_get_socket_cookie(ctx);

			bpf_map_delete_elem(&weir_l7_conns, &cookie);
		}
		return 1;
	}
	if (ctx->op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;
	port = (__u16)ctx->local_port;
	p = bpf_map_lookup_elem(&weir_l7_ports, &port);
	if (!p)
		return 1;
	if (ctx->family == WEIR_AF_INET) {
		key.remote = ctx->remote_ip4;
		key.local = ctx->local_ip4;
	} else if (ctx->family == WEIR_AF_INET6 && l7_v4_mapped(ctx)) {
		/* An IPv4 client of a server listening on [::] (Go, Node and
		 * the JVM by default): the same four-tuple as for AF_INET. */
		key.remote = ctx_load(ctx->remote_ip6[3]);
		key.local = ctx_load(ctx->local_ip6[3]);
	} else {
		return 1; /* IPv6 pods are not part of this single-stack cluster */
	}
	/* remote_port holds the port in network order in its upper half. */
	key.remote_port = bpf_ntohs((__u16)(ctx->remote_port >> 16));
	key.local_port = port;
	switch (p->mode) {
	case WEIR_L7_STRPARSER:
		err = bpf_sock_hash_update(ctx, &weir_l7_strp, &key, BPF_NOEXIST);
		break;
	case WEIR_L7_HTTP:
		l7_track(ctx, p->set);
		err = bpf_sock_hash_update(ctx, &weir_l7_http, &key, BPF_NOEXIST);
		break;
	default:
		err = bpf_sock_hash_update(ctx, &weir_l7_skb, &key, BPF_NOEXIST);
	}
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

/* l7_close drops this skb and every later one of the connection. */
__always_inline_fn int l7_close(struct l7_conn *c)
{
	c->closed = 1;
	l7_count(L7_STAT_CLOSED, 1);
	return SK_DROP;
}

__always_inline_fn int l7_head_unfinished(struct http_state *s)
{
	return s->state >= HS_METHOD && s->state <= HS_HEAD_LF;
}

SEC("sk_skb/verdict")
int l7_http_verdict(struct __sk_buff *skb)
{
	__u64 cookie = bpf_get_socket_cookie(skb);
	struct l7_conn *c = bpf_map_lookup_elem(&weir_l7_conns, &cookie);
	struct l7_walk w = { .skb = skb, .len = skb->len, .head_pos = L7_NO_HEAD };
	struct l7_sock_key key = {};
	__u64 start;
	int r, keep;

	l7_count(L7_STAT_MESSAGES, 1);
	l7_count(L7_STAT_BYTES, skb->len);
	if (!c) {
		l7_count(L7_STAT_NO_STATE, 1);
		return SK_DROP;
	}
	if (c->closed)
		return SK_DROP;
	w.conn = c;
	start = c->s.offset;
	bpf_loop(w.len + 1, l7_step, &w, 0);
	if (w.outcome == L7_WALK_PASS) {
		if (w.pos < w.len)
			return l7_close(c); /* the walk's bound ran out */
		if (l7_head_unfinished(&c->s)) {
			/* Never hand the application a partial head: the bytes
			 * that end it could make a denied request of it. */
			l7_count(L7_STAT_SPLIT, 1);
			return l7_close(c);
		}
		return SK_PASS;
	}
	/* Answer in place only what begins the skb: anything before it in
	 * the skb was allowed and would be lost. */
	if (w.outcome == L7_WALK_DENY && w.head_pos == 0)
		r = l7_answer(skb, 403);
	else if (w.outcome == L7_WALK_REFUSE && c->s.unit_start == start)
		r = l7_answer(skb, 400);
	else
		return l7_close(c);
	if (r < 0)
		return l7_close(c);
	l7_count(L7_STAT_ANSWERED, 1);
	/* The short answer keeps the connection only when the denied head
	 * was the whole skb and has no body to drop. */
	keep = r == 0 && w.outcome == L7_WALK_DENY && w.pos == w.len && c->s.state == HS_IDLE;
	if (!keep)
		l7_close(c);
	key.remote = skb->remote_ip4;
	key.local = skb->local_ip4;
	key.remote_port = bpf_ntohs((__u16)(skb->remote_port >> 16));
	key.local_port = skb->local_port;
	return bpf_sk_redirect_hash(skb, &weir_l7_http, &key, 0);
}

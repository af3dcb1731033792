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
 *   l7_reset_tcp     iter/tcp: resets the connections the verdict closed
 *                    once their last answers have gone (lib/l7reset.h)
 *   l7_proxy_msg     sk_msg of weir_l7_proxy: what the proxy writes for a
 *                    handed connection, into or out of its socket
 *                    (lib/l7proxy.h)
 *   l7_client_msg    sk_msg of weir_l7_client: reads and judges the
 *                    requests a client socket sends, where the client's
 *                    egress policy restricts them (lib/l7client.h)
 *   l7_client_skb    skb_verdict of weir_l7_client: passes what the
 *                    client receives, in order with the answers, and
 *                    reads the status of each (lib/l7reply.h)
 *   l7_server_msg    sk_msg of weir_l7_http: passes what a server
 *                    sends, and reads the status of each answer
 *                    (lib/l7reply.h)
 *
 * The first two verdicts pass everything: they measure what the path
 * itself costs (bench l7-gate). l7_http_verdict judges each request
 * against its connection's HTTP sets in weir_l7_flows (lib/l7flow.h):
 * written by tc from policy when it allowed the SYN, or, for a port
 * given a set directly (weir_l7_ports, tests and benches), by sock_ops.
 */
#include "lib/common.h"
#include "lib/iter.h"
#include "lib/l7sock.h"
#include "lib/l7match.h"
#include "lib/l7http.h"
#include "lib/l7proxy.h"
#include "lib/l7client.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* The hash key the programs were loaded with (HTTP_HASH_KEY0/1,
 * lib/http.h), pinned so a restarted agent loads its programs and writes
 * its rules under the same key: sockets already in weir_l7_http keep the
 * programs they joined with. Written by the agent, read by nothing here. */
struct l7_hash_key {
	__u64 k0, k1;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct l7_hash_key);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_key SEC(".maps");

/* Per-CPU room to build a socket's reader state in: it is too large for
 * the stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct l7_conn);
} weir_l7_scratch SEC(".maps");

/* l7_track gives an accepted socket its reader state and asks to hear
 * of its close; it returns -1 when the state cannot be made. */
__always_inline_fn int l7_track(struct bpf_sock_ops *ctx)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	__u32 zero = 0;
	struct l7_conn *c = bpf_map_lookup_elem(&weir_l7_scratch, &zero);

	if (!c)
		return -1;
	__builtin_memset(c, 0, sizeof(*c));
	/* Forget the state when the socket closes (l7_sockops, STATE_CB);
	 * the flags another sock_ops program set stay. */
	bpf_sock_ops_cb_flags_set(ctx, ctx->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
	return bpf_map_update_elem(&weir_l7_conns, &cookie, c, BPF_NOEXIST) ? -1 : 0;
}

/* l7_join_http puts an accepted socket in weir_l7_http with its reader
 * state; it returns -1 when either fails. A socket whose state could not
 * be made still joins (its verdict drops every skb: closed) rather than
 * reach the application unread; its flow is not marked joined, so tc
 * holds its bytes back as well. */
__always_inline_fn int l7_join_http(struct bpf_sock_ops *ctx, struct l7_sock_key *key)
{
	int tracked = l7_track(ctx);

	if (bpf_sock_hash_update(ctx, &weir_l7_http, key, BPF_NOEXIST))
		return -1;
	l7_replies_make(key, bpf_get_socket_cookie(ctx));
	return tracked;
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

/* l7_sock_key_of names the socket as weir_l7_flows and the socket hashes
 * do; it returns -1 for a socket that is neither IPv4 nor IPv4-mapped. */
__always_inline_fn int l7_sock_key_of(struct bpf_sock_ops *ctx, struct l7_sock_key *key)
{
	if (ctx->family == WEIR_AF_INET) {
		key->remote = ctx->remote_ip4;
		key->local = ctx->local_ip4;
	} else if (ctx->family == WEIR_AF_INET6 && l7_v4_mapped(ctx)) {
		/* An IPv4 client of a server listening on [::] (Go, Node and
		 * the JVM by default): the same four-tuple as for AF_INET. */
		key->remote = ctx_load(ctx->remote_ip6[3]);
		key->local = ctx_load(ctx->local_ip6[3]);
	} else {
		return -1; /* IPv6 pods are not part of this single-stack cluster */
	}
	/* remote_port holds the port in network order in its upper half. */
	key->remote_port = bpf_ntohs((__u16)(ctx->remote_port >> 16));
	key->local_port = (__u16)ctx->local_port;
	return 0;
}

/* l7_slot_closed tells the proxy its slot's connection has closed. */
__always_inline_fn void l7_slot_closed(__u16 conn_slot, __u64 cookie)
{
	struct l7_handoff *h = l7_slot_serving(conn_slot, cookie);

	if (h)
		h->state = L7_SLOT_CLOSED;
}

/* l7_client_closed records a closing client socket's last repeated
 * requests and forgets its reader state and flow. */
__always_inline_fn void l7_client_closed(struct l7_sock_key *own, struct l7_client *cl)
{
	struct l7_sock_key server = l7_server_view(own);
	struct l7_out_flow *f = bpf_map_lookup_elem(&weir_l7_out, own);
	__u32 none[L7_FLOW_SETS] = {};

	l7_reply_flush(bpf_map_lookup_elem(&weir_l7_replies, own), &server, f ? f->sets : none, L7_DIR_EGRESS);
	l7_event_repeats(&cl->conn.run, &server, cl->cookie, f ? f->sets : none, L7_DIR_EGRESS);
	if (cl->conn.slot)
		l7_slot_closed(cl->conn.slot, cl->cookie);
	bpf_map_delete_elem(&weir_l7_replies, own);
	bpf_map_delete_elem(&weir_l7_client_conns, own);
	bpf_map_delete_elem(&weir_l7_out, own);
}

/* l7_closed records a closing socket's last repeated requests and
 * forgets its reader state and flow. */
__always_inline_fn void l7_closed(struct bpf_sock_ops *ctx)
{
	struct l7_sock_key key = {};
	__u64 cookie = bpf_get_socket_cookie(ctx);
	struct l7_conn *c = bpf_map_lookup_elem(&weir_l7_conns, &cookie);
	__u32 none[L7_FLOW_SETS] = {};
	struct l7_client *cl;
	struct l7_flow *f;

	if (l7_sock_key_of(ctx, &key)) {
		bpf_map_delete_elem(&weir_l7_conns, &cookie);
		bpf_map_delete_elem(&weir_l7_closing, &cookie);
		return;
	}
	cl = bpf_map_lookup_elem(&weir_l7_client_conns, &key);
	if (cl && cl->cookie == cookie) {
		l7_client_closed(&key, cl);
		return;
	}
	f = bpf_map_lookup_elem(&weir_l7_flows, &key);
	l7_reply_flush(bpf_map_lookup_elem(&weir_l7_replies, &key), &key, f ? f->sets : none, L7_DIR_INGRESS);
	bpf_map_delete_elem(&weir_l7_replies, &key);
	if (c)
		l7_event_repeats(&c->run, &key, cookie, f ? f->sets : none, L7_DIR_INGRESS);
	if (c && c->slot)
		l7_slot_closed(c->slot, cookie);
	bpf_map_delete_elem(&weir_l7_conns, &cookie);
	bpf_map_delete_elem(&weir_l7_flows, &key);
	bpf_map_delete_elem(&weir_l7_out, &key); /* a client's that could not join */
	bpf_map_delete_elem(&weir_l7_closing, &cookie);
}

/* l7_join_failed lists a restricted connection that could not join its
 * reader for reset: tc holds its bytes back for good (it stays unjoined),
 * so its client learns now rather than at its timeout. */
__always_inline_fn void l7_join_failed(struct bpf_sock_ops *ctx, struct l7_sock_key *key)
{
	bpf_sock_ops_cb_flags_set(ctx, ctx->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
	l7_closing_list(bpf_get_socket_cookie(ctx), key->local, 0, 0, 0, 0);
}

/* l7_client_join puts a client socket whose connection its egress
 * policy restricts in weir_l7_client with its reader state, and marks
 * the flow joined from where its stream stands: every byte after it is
 * judged by l7_client_msg before it leaves. A socket that cannot join is
 * not marked: tc drops whatever it sends (l7flow.h), and its
 * application's connection times out. */
__always_inline_fn void l7_client_join(struct bpf_sock_ops *ctx, struct l7_sock_key *key, struct l7_out_flow *f)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	__u32 zero = 0;
	struct l7_client *cl = bpf_map_lookup_elem(&weir_l7_client_scratch, &zero);

	if (!cl)
		goto fail;
	__builtin_memset(cl, 0, sizeof(*cl));
	cl->cookie = cookie;
	if (bpf_map_update_elem(&weir_l7_client_conns, key, cl, BPF_ANY))
		goto fail;
	bpf_sock_ops_cb_flags_set(ctx, ctx->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
	if (bpf_sock_hash_update(ctx, &weir_l7_client, key, BPF_NOEXIST)) {
		bpf_map_delete_elem(&weir_l7_client_conns, key);
		goto fail;
	}
	/* Where the stream stands: a byte written before the join (Fast
	 * Open data, a send that was waiting for the handshake) is above
	 * the mark, never sent, and the first message finds TCP's write
	 * sequence past the mark, and closes the connection. */
	l7_replies_make(key, cookie);
	f->cookie = cookie;
	f->judged = ctx->snd_una;
	f->joined = 1;
	l7_count(L7_STAT_CLIENTS, 1);
	return;
fail:
	/* tc holds its bytes for good: reset it now rather than leave its
	 * application waiting for its timeout. */
	l7_count(L7_STAT_JOIN_FAIL, 1);
	l7_join_failed(ctx, key);
}

SEC("sockops")
int l7_sockops(struct bpf_sock_ops *ctx)
{
	struct l7_sock_key key = {};
	struct l7_flow *f, own = {};
	struct l7_out_flow *out;
	struct l7_port *p;
	__u16 port;
	long err;

	if (ctx->op == BPF_SOCK_OPS_STATE_CB) {
		if (ctx->args[1] == BPF_TCP_CLOSE)
			l7_closed(ctx);
		return 1;
	}
	if (ctx->op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB) {
		/* A connection its client's egress policy restricts: tc
		 * wrote its entry when it allowed the SYN. */
		if (l7_sock_key_of(ctx, &key))
			return 1;
		out = bpf_map_lookup_elem(&weir_l7_out, &key);
		if (out)
			l7_client_join(ctx, &key, out);
		return 1;
	}
	if (ctx->op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;
	if (l7_sock_key_of(ctx, &key))
		return 1;
	/* A connection policy restricts to HTTP rules: tc wrote its flow
	 * when it allowed the SYN, and holds its bytes until joined. */
	f = bpf_map_lookup_elem(&weir_l7_flows, &key);
	if (f) {
		err = l7_join_http(ctx, &key);
		if (!err)
			f->joined = 1;
		else
			l7_join_failed(ctx, &key);
		l7_count(err ? L7_STAT_JOIN_FAIL : L7_STAT_SOCKETS, 1);
		return 1;
	}
	port = key.local_port;
	p = bpf_map_lookup_elem(&weir_l7_ports, &port);
	if (!p)
		return 1;
	switch (p->mode) {
	case WEIR_L7_STRPARSER:
		err = bpf_sock_hash_update(ctx, &weir_l7_strp, &key, BPF_NOEXIST);
		break;
	case WEIR_L7_HTTP:
		/* The port's own set: the flow is written here, joined. */
		err = l7_join_http(ctx, &key);
		if (!err) {
			own.sets[0] = p->set;
			own.joined = 1;
			err = bpf_map_update_elem(&weir_l7_flows, &key, &own, BPF_ANY);
		}
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

/* l7_list_closed lists the skb's socket for reset (lib/l7reset.h) once
 * answer_len bytes written in the server's place (0: none) and what the
 * server owes before them have gone out. c may be NULL: a socket with no
 * reader state. */
__always_inline_fn void l7_list_closed(struct __sk_buff *skb, __u64 cookie, struct l7_conn *c, __u32 answer_len)
{
	__u32 seq = 0;
	int have = l7_write_seq(skb, &seq) == 0;
	int owes = c && c->outstanding && seq == c->seq_at_allow;

	l7_closing_list(cookie, skb->local_ip4, have, seq, answer_len, owes);
}

/* l7_mark_closed makes every later skb of the connection dropped and
 * lists it for reset once answer_len bytes written in the server's place
 * (0: none) have gone out. */
__always_inline_fn void l7_mark_closed(struct __sk_buff *skb, __u64 cookie, struct l7_conn *c, __u32 answer_len)
{
	c->closed = 1;
	l7_count(L7_STAT_CLOSED, 1);
	l7_list_closed(skb, cookie, c, answer_len);
}

/* l7_close drops this skb and every later one of the connection. */
__always_inline_fn int l7_close(struct __sk_buff *skb, __u64 cookie, struct l7_conn *c)
{
	l7_mark_closed(skb, cookie, c, 0);
	return SK_DROP;
}

__always_inline_fn int l7_head_unfinished(struct http_state *s)
{
	return s->state >= HS_METHOD && s->state <= HS_HEAD_LF;
}

/* l7_record_stop records the request a walk stopped at, before the skb
 * is answered over or dropped: ev_verdict is L7_EV_*, flags L7_EVF_*.
 * The connection's run ends first, so records keep the requests' order. */
__always_inline_fn void l7_record_stop(struct l7_walk *w, __u8 ev_verdict, __u8 flags)
{
	struct l7_request_event *ev;

	l7_event_repeats(&w->conn->run, &w->key, w->cookie, w->sets, w->dir);
	ev = l7_event_reserve(&w->key, w->cookie, w->sets, w->dir);
	if (!ev)
		return;
	l7_reply_attach(w->replies, ev);
	ev->verdict = ev_verdict;
	ev->error = w->conn->s.error;
	ev->flags = flags | w->punt_why;
	if (w->head_pos != L7_NO_HEAD) {
		struct l7_src src = l7_walk_src(w);

		l7_event_text(ev, &src, w->head_pos, &w->conn->s);
	}
	l7_event_submit(ev);
}

/* l7_walk_verdict is the record verdict of a walk that stopped. */
__always_inline_fn __u8 l7_walk_verdict(__u8 outcome)
{
	switch (outcome) {
	case L7_WALK_DENY:
		return L7_EV_DENIED;
	case L7_WALK_REFUSE:
		return L7_EV_REFUSED;
	}
	return L7_EV_PUNTED;
}

/* l7_walk_to_proxy says whether what a walk stopped at goes to user
 * space: what the kernel cannot judge, and a denial after allowed bytes
 * in one skb or message (which cannot be answered in place without
 * losing them). Not an upgrade: whether the server switched protocols is
 * in its answer, which the proxy does not see. */
__always_inline_fn int l7_walk_to_proxy(const struct l7_walk *w)
{
	return (w->outcome == L7_WALK_PUNT && w->punt_why != L7_EVF_UPGRADE) ||
	       (w->outcome == L7_WALK_DENY && w->head_pos != 0 && w->head_pos != L7_NO_HEAD);
}

/* l7_hand_off hands the connection to a free proxy slot from this skb
 * on: its first prefix bytes were allowed here, a head begins after them.
 * It returns SK_PASS (the skb redirected), or -1 when no slot is free or
 * the redirect fails: the caller closes the connection as before. */
__always_inline_fn int l7_hand_off(struct l7_walk *w, __u32 prefix, __u8 h2)
{
	struct l7_conn *c = w->conn;
	struct l7_handoff *h;
	__u32 slot;

	h = l7_slot_take(w->cookie, &w->key, w->sets, &slot);
	if (!h)
		return -1;
	l7_slot_serve(h, prefix, c->outstanding, c->seq_at_allow, h2, 0);
	c->slot = slot + 1;
	/* The proxy's requests go on unseen here: their answers are not read. */
	l7_reply_stop(w->replies, &w->key, w->sets, w->dir);
	if (l7_to_proxy(w->skb, c->slot, h) != SK_PASS) {
		h->state = L7_SLOT_CLOSED;
		return -1;
	}
	l7_count(L7_STAT_HANDED, 1);
	return SK_PASS;
}

/* l7_try_hand_off hands what the kernel cannot judge to user space, with
 * its record; on failure the connection is closed, as it was before the
 * proxy existed. */
__always_inline_fn int l7_try_hand_off(struct l7_walk *w, __u8 ev_verdict)
{
	if (w->head_pos != L7_NO_HEAD && l7_hand_off(w, w->head_pos, 0) == SK_PASS) {
		l7_record_stop(w, ev_verdict, L7_EVF_HANDED);
		return SK_PASS;
	}
	l7_record_stop(w, ev_verdict, L7_EVF_CLOSED);
	return l7_close(w->skb, w->cookie, w->conn);
}

/* The connection preface of HTTP/2 (RFC 9113, 3.4): a client that knows
 * its server speaks h2c (gRPC's do) opens with it. */
#define L7_H2C_PREFACE_LEN 24
static const char l7_h2c_preface[L7_H2C_PREFACE_LEN] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/* l7_is_h2c says whether src (an skb, or a message a client sends)
 * opens with the whole HTTP/2 preface. One cut short is read as HTTP/1,
 * whose reader refuses it (400). */
__always_inline_fn int l7_is_h2c(const struct l7_src *src)
{
	__u8 b[L7_H2C_PREFACE_LEN];
	int i;

	if (src->len < L7_H2C_PREFACE_LEN || l7_src_load(src, 0, b, sizeof(b)))
		return 0;
#pragma unroll
	for (i = 0; i < L7_H2C_PREFACE_LEN; i++)
		if (b[i] != (__u8)l7_h2c_preface[i])
			return 0;
	return 1;
}

/* l7_hand_off_h2c hands an h2c connection whole to a proxy slot, which
 * from now on also receives what the server sends (l7_server_msg). With
 * no slot free, or no answer side of its own to steer the server's
 * frames by, it is refused and closed as before the proxy spoke HTTP/2. */
__always_inline_fn int l7_hand_off_h2c(struct l7_walk *w)
{
	w->head_pos = 0;
	if (w->replies->cookie == w->cookie && !w->replies->lost && l7_hand_off(w, 0, 1) == SK_PASS) {
		l7_count(L7_STAT_H2C, 1);
		return SK_PASS;
	}
	w->conn->s.error = HTTP_ERR_VERSION;
	l7_record_stop(w, L7_EV_REFUSED, L7_EVF_CLOSED);
	return l7_close(w->skb, w->cookie, w->conn);
}

SEC("sk_skb/verdict")
int l7_http_verdict(struct __sk_buff *skb)
{
	__u64 cookie = bpf_get_socket_cookie(skb);
	struct l7_conn *c = bpf_map_lookup_elem(&weir_l7_conns, &cookie);
	struct l7_walk w = { .skb = skb, .len = skb->len, .head_pos = L7_NO_HEAD };
	struct l7_sock_key key = {};
	struct l7_replies *replies;
	struct l7_flow *f;
	__u64 start;
	int r, keep;

	l7_count(L7_STAT_MESSAGES, 1);
	l7_count(L7_STAT_BYTES, skb->len);
	if (!c) {
		/* Never read, so never to be: reset it. */
		l7_count(L7_STAT_NO_STATE, 1);
		l7_list_closed(skb, cookie, NULL, 0);
		return SK_DROP;
	}
	if (c->closed)
		return SK_DROP;
	if (c->slot) {
		/* Handed to user space: every later skb goes to the proxy,
		 * but for an empty one (a FIN's), which carries nothing to
		 * judge and which the proxy's socket cannot read. */
		struct l7_handoff *h;

		if (!skb->len)
			return SK_PASS;
		h = l7_slot_serving(c->slot, cookie);
		if (h && l7_to_proxy(skb, c->slot, h) == SK_PASS)
			return SK_PASS;
		return l7_close(skb, cookie, c);
	}
	key = l7_skb_key(skb);
	w.key = key;
	w.cookie = cookie;
	replies = l7_replies_of(&key);
	f = bpf_map_lookup_elem(&weir_l7_flows, &key);
	if (!f || !replies) {
		/* Evicted or never written: what to judge against is unknown. */
		l7_count(L7_STAT_NO_STATE, 1);
		return l7_close(skb, cookie, c);
	}
	w.sets[0] = f->sets[0];
	w.sets[1] = f->sets[1];
	w.sets[2] = f->sets[2];
	w.conn = c;
	w.replies = replies;
	start = c->s.offset;
	if (!start) {
		struct l7_src src = { .skb = skb, .len = skb->len };

		if (l7_is_h2c(&src))
			return l7_hand_off_h2c(&w);
	}
	l7_dfa_prepare(&c->s, w.sets);
	bpf_loop(w.len + 1, l7_step, &w, 0);
	if (w.outcome == L7_WALK_PASS) {
		if (w.pos < w.len)
			return l7_close(skb, cookie, c); /* the walk's bound ran out */
		if (l7_head_unfinished(&c->s)) {
			/* Never hand the application a partial head: the bytes
			 * that end it could make a denied request of it. User
			 * space assembles it. */
			l7_count(L7_STAT_SPLIT, 1);
			return l7_try_hand_off(&w, L7_EV_SPLIT);
		}
		return SK_PASS;
	}
	if (l7_walk_to_proxy(&w))
		return l7_try_hand_off(&w, l7_walk_verdict(w.outcome));
	/* Answer in place only what begins the skb: anything before it in
	 * the skb was allowed and would be lost. */
	r = -1;
	if (w.outcome == L7_WALK_DENY && w.head_pos == 0)
		r = l7_answer_room(skb, 403);
	else if (w.outcome == L7_WALK_REFUSE && c->s.unit_start == start)
		r = l7_answer_room(skb, 400);
	if (r >= 0 && !l7_answer_safe(&w)) {
		l7_count(L7_STAT_PIPELINED, 1);
		l7_record_stop(&w, l7_walk_verdict(w.outcome), L7_EVF_CLOSED | L7_EVF_PIPELINED);
		return l7_close(skb, cookie, c);
	}
	/* A denied request too short to hold a 403 in place: the proxy
	 * answers it, and the connection goes on. */
	if (r < 0 && w.outcome == L7_WALK_DENY && w.head_pos == 0)
		return l7_try_hand_off(&w, L7_EV_DENIED);
	if (r < 0) {
		l7_record_stop(&w, l7_walk_verdict(w.outcome), L7_EVF_CLOSED);
		return l7_close(skb, cookie, c);
	}
	/* The short answer keeps the connection only when the denied head
	 * was the whole skb and has no body to drop. */
	keep = r == 0 && w.outcome == L7_WALK_DENY && w.pos == w.len && c->s.state == HS_IDLE;
	/* Recorded before the answer writes over the request. */
	l7_record_stop(&w, l7_walk_verdict(w.outcome), L7_EVF_ANSWERED | (keep ? 0 : L7_EVF_CLOSED));
	/* Listed before the answer is sent: the reset waits for it. */
	if (!keep)
		l7_mark_closed(skb, cookie, c, skb->len);
	l7_answer(skb, w.outcome == L7_WALK_DENY ? 403 : 400);
	l7_count(L7_STAT_ANSWERED, 1);
	return bpf_sk_redirect_hash(skb, &weir_l7_http, &key, 0);
}

SEC("iter/tcp")
int l7_reset_tcp(struct bpf_iter__tcp *ctx)
{
	struct sock_common *sk = ctx->sk_common;
	struct l7_closing *e;
	struct tcp_sock *tp;
	__u64 cookie;

	if (!sk || !iter_tcp_connected(sk))
		return 0;
	cookie = bpf_get_socket_cookie(sk);
	e = bpf_map_lookup_elem(&weir_l7_closing, &cookie);
	if (!e)
		return 0;
	tp = bpf_skc_to_tcp_sock(sk);
	if (!tp || !l7_closing_ready(e, tp, bpf_ktime_get_ns()))
		return 0;
	if (bpf_sock_destroy(sk) == 0)
		l7_count(L7_STAT_RESET, 1);
	bpf_map_delete_elem(&weir_l7_closing, &cookie);
	return 0;
}

/* l7_proxy_client carries what the proxy writes for a client's
 * connection (lib/l7proxy.h): from P, the bytes it allows, out on the
 * client's socket, past the judged mark; from Q, its answers, into the
 * client socket's receive queue. */
__always_inline_fn int l7_proxy_client(struct sk_msg_md *msg, struct l7_handoff *h, int answer)
{
	struct l7_sock_key own = l7_server_view(&h->key);
	struct l7_out_flow *f;

	if (answer) {
		l7_count(L7_STAT_PROXY_ANSWERED, 1);
		return bpf_msg_redirect_hash(msg, &weir_l7_client, &own, BPF_F_INGRESS);
	}
	f = bpf_map_lookup_elem(&weir_l7_out, &own);
	if (!f || f->cookie != h->cookie)
		return SK_DROP;
	f->judged += msg->size;
	l7_count(L7_STAT_PROXY_FORWARDED, msg->size);
	return bpf_msg_redirect_hash(msg, &weir_l7_client, &own, 0);
}

/* l7_proxy_msg carries what the proxy writes for the connection its slot
 * serves: from P, the bytes it allows, into the server socket's receive
 * queue; from Q, its answers, out on the server socket to the client
 * (for a client's connection, l7_proxy_client). A slot that serves
 * nothing (freed, or its connection closed) takes nothing: the write
 * fails. */
SEC("sk_msg")
int l7_proxy_msg(struct sk_msg_md *msg)
{
	__u32 port = msg->local_port;
	__u32 *slot = bpf_map_lookup_elem(&weir_l7_proxy_ports, &port);
	struct l7_sock_key key;
	struct l7_handoff *h;
	int answer = 0;

	if (!slot) {
		port = bpf_ntohs((__u16)(msg->remote_port >> 16));
		slot = bpf_map_lookup_elem(&weir_l7_proxy_ports, &port);
		answer = 1;
	}
	if (!slot)
		return SK_DROP;
	h = bpf_map_lookup_elem(&weir_l7_handoff, slot);
	if (!h || h->state != L7_SLOT_ACTIVE)
		return SK_DROP;
	if (h->egress)
		return l7_proxy_client(msg, h, answer);
	key = h->key;
	if (answer) {
		l7_count(L7_STAT_PROXY_ANSWERED, 1);
		return bpf_msg_redirect_hash(msg, &weir_l7_http, &key, 0);
	}
	l7_count(L7_STAT_PROXY_FORWARDED, msg->size);
	return bpf_msg_redirect_hash(msg, &weir_l7_http, &key, BPF_F_INGRESS);
}

/* l7_client_pass lets the message go: the flow's judged mark moves past
 * its last byte (TCP stands at the mark: l7_client_msg checked), so tc
 * lets those bytes out, and no cork is left set (a cork stays in force
 * for later messages until it is reset). */
__always_inline_fn int l7_client_pass(struct l7_walk *w, struct l7_client *cl, struct l7_out_flow *f)
{
	f->judged += w->len;
	cl->walked = 0;
	bpf_msg_cork_bytes(w->msg, 0);
	return SK_PASS;
}

/* l7_client_close drops this message and every later one of the
 * connection: the application's sends fail from now on. */
__always_inline_fn int l7_client_close(struct l7_walk *w, struct l7_client *cl)
{
	cl->conn.closed = 1;
	cl->walked = 0;
	l7_count(L7_STAT_CLOSED, 1);
	bpf_msg_cork_bytes(w->msg, 0);
	return SK_DROP;
}

/* l7_client_stop records the request the walk stopped at and closes the
 * connection. */
__always_inline_fn int l7_client_stop(struct l7_walk *w, struct l7_client *cl, __u8 flags)
{
	l7_record_stop(w, l7_walk_verdict(w->outcome), L7_EVF_CLOSED | flags);
	return l7_client_close(w, cl);
}

/* l7_client_body_ends says whether the denied request's body, if any,
 * ends exactly where the message does: then nothing of a later request
 * is lost with it, and the reader moves past it. */
__always_inline_fn int l7_client_body_ends(struct l7_walk *w, struct http_state *s)
{
	if (s->state == HS_IDLE)
		return w->pos == w->len;
	if (s->state != HS_BODY || s->remaining != w->len - w->pos)
		return 0;
	http_skip(s, s->remaining);
	return s->state == HS_IDLE;
}

/* l7_client_answer rewrites the message into status's answer and puts
 * it on the socket's own receive queue. */
__always_inline_fn int l7_client_answer(struct l7_walk *w, struct l7_client *cl, struct l7_sock_key *own, int status,
					int keep)
{
	l7_record_stop(w, l7_walk_verdict(w->outcome), L7_EVF_ANSWERED | (keep ? 0 : L7_EVF_CLOSED));
	if (!keep) {
		cl->conn.closed = 1;
		l7_count(L7_STAT_CLOSED, 1);
	}
	cl->walked = 0;
	bpf_msg_cork_bytes(w->msg, 0);
	if (l7_msg_answer(w->msg, status, keep)) {
		cl->conn.closed = 1;
		return SK_DROP;
	}
	l7_count(L7_STAT_ANSWERED, 1);
	return bpf_msg_redirect_hash(w->msg, &weir_l7_client, own, BPF_F_INGRESS);
}

/* l7_client_take_slot hands a client's connection to a free proxy slot
 * from this message on (lib/l7proxy.h), its first prefix bytes allowed
 * here; -1 when no slot is free or the redirect fails. */
__always_inline_fn int l7_client_take_slot(struct l7_walk *w, struct l7_client *cl, __u32 prefix, __u8 h2)
{
	struct l7_handoff *h;
	__u32 slot;

	h = l7_slot_take(w->cookie, &w->key, w->sets, &slot);
	if (!h)
		return -1;
	l7_slot_serve(h, prefix, cl->conn.outstanding, cl->conn.seq_at_allow, h2, 1);
	cl->conn.slot = slot + 1;
	cl->walked = 0;
	bpf_msg_cork_bytes(w->msg, 0);
	l7_reply_stop(w->replies, &w->key, w->sets, w->dir);
	if (l7_msg_to_proxy(w->msg, cl->conn.slot, h) != SK_PASS) {
		h->state = L7_SLOT_CLOSED;
		return -1;
	}
	l7_count(L7_STAT_HANDED, 1);
	return 0;
}

/* l7_client_hand_off hands to user space what the kernel cannot judge
 * of a client's requests, and a denial after allowed bytes in one
 * message; the bytes before the head the walk stopped at were allowed
 * and go on unjudged. With no slot free the connection is closed, as
 * before the proxy judged egress. */
__always_inline_fn int l7_client_hand_off(struct l7_walk *w, struct l7_client *cl, __u8 ev_verdict)
{
	if (w->head_pos == L7_NO_HEAD || l7_client_take_slot(w, cl, w->head_pos, 0))
		return l7_client_stop(w, cl, 0);
	l7_record_stop(w, ev_verdict, L7_EVF_HANDED);
	return SK_PASS;
}

/* l7_msg_opens_h2c says whether a client's message opens with the whole
 * HTTP/2 preface: a function of its own, verified once, so the verdict's
 * paths do not multiply by its comparisons. */
__attribute__((noinline)) int l7_msg_opens_h2c(struct sk_msg_md *msg)
{
	struct l7_src src = { .msg = msg, .len = msg->size, .is_msg = 1 };

	return l7_is_h2c(&src);
}

/* l7_client_hand_off_h2c hands a client's h2c connection whole to a
 * proxy slot at its preface; l7_client_skb then steers what the server
 * sends into the slot too. It needs the connection's own answer side
 * (its record of the server's answers) to steer them by; without it, or
 * with no slot free, the preface is refused and the connection closed,
 * as before the proxy spoke HTTP/2 for clients. */
__always_inline_fn int l7_client_hand_off_h2c(struct l7_walk *w, struct l7_client *cl)
{
	w->head_pos = 0;
	if (w->replies->cookie == w->cookie && !w->replies->lost && !l7_client_take_slot(w, cl, 0, 1)) {
		l7_count(L7_STAT_H2C, 1);
		return SK_PASS;
	}
	cl->conn.s.error = HTTP_ERR_VERSION;
	w->outcome = L7_WALK_REFUSE;
	return l7_client_stop(w, cl, 0);
}

/* l7_client_handed sends a message of a handed client's connection to
 * its slot; once the slot no longer serves it, the connection is closed. */
__always_inline_fn int l7_client_handed(struct l7_walk *w, struct l7_client *cl)
{
	struct l7_handoff *h = l7_slot_serving(cl->conn.slot, cl->cookie);

	if (h && l7_msg_to_proxy(w->msg, cl->conn.slot, h) == SK_PASS)
		return SK_PASS;
	return l7_client_close(w, cl);
}

SEC("sk_msg")
int l7_client_msg(struct sk_msg_md *msg)
{
	struct l7_walk w = { .msg = msg, .len = msg->size, .head_pos = L7_NO_HEAD, .dir = L7_DIR_EGRESS };
	struct l7_sock_key own = {};
	struct l7_replies *replies;
	struct l7_out_flow *f;
	struct l7_client *cl;
	__u64 start;
	__u32 seq;

	l7_count(L7_STAT_MESSAGES, 1);
	l7_count(L7_STAT_BYTES, w.len);
	if (l7_msg_key(msg, &own))
		return SK_DROP; /* joined as IPv4: cannot be */
	cl = bpf_map_lookup_elem(&weir_l7_client_conns, &own);
	if (!cl) {
		l7_count(L7_STAT_NO_STATE, 1);
		return SK_DROP;
	}
	if (cl->conn.closed)
		return SK_DROP;
	w.conn = &cl->conn;
	w.cookie = cl->cookie;
	if (cl->conn.slot)
		return l7_client_handed(&w, cl);
	w.key = l7_server_view(&own);
	replies = l7_replies_of(&own);
	f = bpf_map_lookup_elem(&weir_l7_out, &own);
	if (!f || !replies) {
		/* Evicted: what to judge against is unknown. */
		l7_count(L7_STAT_NO_STATE, 1);
		return l7_client_close(&w, cl);
	}
	w.sets[0] = f->sets[0];
	w.sets[1] = f->sets[1];
	w.sets[2] = f->sets[2];
	w.replies = replies;
	/* Every byte TCP took must be one the verdict judged, and nothing
	 * more: a send TCP took only in part (a full send buffer, a signal,
	 * a timeout), another thread's send interleaved with it while it
	 * waited, a cork the kernel pushed anyway, or bytes written before
	 * the join leave the reader out of step with what the server reads. */
	if (l7_msg_write_seq(msg, &seq) || seq != f->judged) {
		l7_count(L7_STAT_SEND_DESYNC, 1);
		return l7_client_close(&w, cl);
	}
	/* A corked message comes back whole with what was added: its walk
	 * goes on where it stopped. */
	if (cl->walked) {
		if (cl->walked >= w.len)
			return l7_client_close(&w, cl);
		w.pos = cl->walked;
		w.head_pos = cl->head_pos;
	}
	start = cl->conn.s.offset - w.pos;
	if (!start && !w.pos && l7_msg_opens_h2c(msg))
		return l7_client_hand_off_h2c(&w, cl);
	l7_dfa_prepare(&cl->conn.s, w.sets);
	bpf_loop(w.len - w.pos + 1, l7_step, &w, 0);
	if (w.outcome == L7_WALK_PASS) {
		if (w.pos < w.len)
			return l7_client_close(&w, cl); /* the walk's bound ran out */
		if (l7_head_unfinished(&cl->conn.s)) {
			/* Hold it all until the head is whole: the reader bounds
			 * a head's length, so the cork is bounded too. */
			cl->walked = w.len;
			cl->head_pos = w.head_pos;
			l7_count(L7_STAT_CORKED, 1);
			bpf_msg_cork_bytes(msg, w.len + 1);
			return SK_PASS;
		}
		return l7_client_pass(&w, cl, f);
	}
	if (l7_walk_to_proxy(&w))
		return l7_client_hand_off(&w, cl, l7_walk_verdict(w.outcome));
	if (w.outcome == L7_WALK_PUNT)
		return l7_client_stop(&w, cl, 0);
	/* Answer in place only what begins the message: anything before it
	 * was allowed, and would be lost. */
	if (w.outcome == L7_WALK_DENY && w.head_pos == 0) {
		if (!l7_answer_safe(&w)) {
			l7_count(L7_STAT_PIPELINED, 1);
			return l7_client_stop(&w, cl, L7_EVF_PIPELINED);
		}
		return l7_client_answer(&w, cl, &own, 403, l7_client_body_ends(&w, &cl->conn.s));
	}
	if (w.outcome == L7_WALK_REFUSE && cl->conn.s.unit_start == start && l7_answer_safe(&w))
		return l7_client_answer(&w, cl, &own, 400, 0);
	return l7_client_stop(&w, cl, 0);
}

/* l7_to_answer_side redirects what the server of an h2c connection
 * handed to slot conn_slot sends into the slot's Q (BPF_F_INGRESS), where
 * the proxy's HTTP/2 client reads it. */
__always_inline_fn int l7_to_answer_side(struct __sk_buff *skb, __u16 conn_slot)
{
	__u32 q = (__u32)(conn_slot - 1) * 2 + 1;

	l7_count(L7_STAT_H2C_SERVER_BYTES, skb->len);
	return bpf_sk_redirect_hash(skb, &weir_l7_proxy, &q, BPF_F_INGRESS);
}

/* l7_client_skb_handed steers what a handed client's server sends: an
 * h2c connection's into its slot while the slot serves it, nothing once
 * it stopped (the client speaks HTTP/2 with the proxy); every other
 * connection's to the client, as sent. The egress twin of
 * l7_server_handed. */
__always_inline_fn int l7_client_skb_handed(struct __sk_buff *skb, struct l7_sock_key *own, __u64 cookie)
{
	struct l7_client *cl = bpf_map_lookup_elem(&weir_l7_client_conns, own);
	struct l7_handoff *h;

	if (!cl || cl->cookie != cookie || !cl->conn.slot)
		return SK_PASS;
	h = l7_slot_serving(cl->conn.slot, cookie);
	if (!h || !h->h2)
		return SK_PASS;
	if (h->state != L7_SLOT_ACTIVE)
		return SK_DROP;
	return l7_to_answer_side(skb, cl->conn.slot);
}

/* l7_client_first hands a client's connection whose server speaks before
 * the client has sent a byte to a proxy slot as HTTP/2, as
 * l7_server_first does on a server's side (an HTTP/2 server's SETTINGS
 * may come before the client's preface): the frame must reach the
 * proxy's HTTP/2 client, since the client will speak HTTP/2 with the
 * proxy. With no slot free the bytes go on to the client, and its
 * preface is refused when it comes. */
__always_inline_fn int l7_client_first(struct __sk_buff *skb, struct l7_replies *r, struct l7_sock_key *own)
{
	struct l7_client *cl = bpf_map_lookup_elem(&weir_l7_client_conns, own);
	struct l7_sock_key server = l7_server_view(own);
	struct l7_handoff *h;
	struct l7_out_flow *f;
	__u32 slot;

	if (!cl || cl->cookie != r->cookie || cl->conn.closed || cl->conn.slot || cl->conn.s.offset || cl->walked)
		return SK_PASS;
	f = bpf_map_lookup_elem(&weir_l7_out, own);
	if (!f)
		return SK_PASS;
	h = l7_slot_take(r->cookie, &server, f->sets, &slot);
	if (!h)
		return SK_PASS;
	l7_slot_serve(h, 0, 0, 0, 1, 1);
	cl->conn.slot = slot + 1;
	l7_reply_stop(r, &server, f->sets, L7_DIR_EGRESS);
	l7_count(L7_STAT_H2C, 1);
	return l7_to_answer_side(skb, cl->conn.slot);
}

/* l7_client_skb passes everything the client receives, and reads the
 * status of the answers to the requests its verdict allowed. */
SEC("sk_skb/verdict")
int l7_client_skb(struct __sk_buff *skb)
{
	struct l7_src src = { .skb = skb, .len = skb->len };
	struct l7_sock_key own = {}, server;
	struct l7_out_flow *f;
	struct l7_replies *r;

	if (!skb->len)
		return SK_PASS;
	own = l7_skb_key(skb);
	r = bpf_map_lookup_elem(&weir_l7_replies, &own);
	if (!r || r->cookie != bpf_get_socket_cookie(skb))
		return SK_PASS;
	if (r->lost)
		return l7_client_skb_handed(skb, &own, r->cookie);
	if (!r->waiting && !r->asked_ns)
		return l7_client_first(skb, r, &own);
	if (!r->waiting)
		return SK_PASS;
	f = bpf_map_lookup_elem(&weir_l7_out, &own);
	if (!f)
		return SK_PASS;
	server = l7_server_view(&own);
	l7_reply_read(r, &src, &server, f->sets, L7_DIR_EGRESS);
	return SK_PASS;
}

/* l7_server_handed steers what the server of a connection whose answers
 * are no longer read sends: an h2c connection's, while its slot serves
 * it, into the proxy (Q's receive queue), which writes its own frames to
 * the client; nothing once the slot stopped serving it (the proxy ended
 * it, or its pair broke), since the client speaks HTTP/2 with the proxy.
 * Every other connection's goes out as sent. */
__always_inline_fn int l7_server_handed(struct sk_msg_md *msg, __u64 cookie)
{
	struct l7_conn *c = bpf_map_lookup_elem(&weir_l7_conns, &cookie);
	struct l7_handoff *h;
	__u32 q;

	if (!c || !c->slot)
		return SK_PASS;
	h = l7_slot_serving(c->slot, cookie);
	if (!h || !h->h2)
		return SK_PASS;
	if (h->state != L7_SLOT_ACTIVE)
		return SK_DROP;
	q = (__u32)(c->slot - 1) * 2 + 1;
	l7_count(L7_STAT_H2C_SERVER_BYTES, msg->size);
	return bpf_msg_redirect_hash(msg, &weir_l7_proxy, &q, BPF_F_INGRESS);
}

/* l7_server_first hands a connection whose server speaks before its
 * client has sent a byte to a proxy slot as HTTP/2, steering what the
 * server sends into it. An HTTP/1 server never speaks first; an HTTP/2
 * server may (its SETTINGS frame, RFC 9113 3.4: grpc-go's does at once),
 * and that frame must reach the proxy's HTTP/2 client, not the client,
 * which will speak HTTP/2 with the proxy. The client's first skb then
 * goes to the slot too (the verdict finds it handed). A server speaking
 * first in any other protocol on a port with HTTP rules gets its
 * connection ended by the proxy, whose HTTP/2 server reads the client.
 * With no slot free the bytes go on as sent, and the client's preface is
 * refused when it comes (l7_hand_off_h2c). Only a server that has not
 * been asked anything gets here (answers.asked_ns 0), and Weir's own
 * answers in its place follow a request read (the reader's offset). */
__always_inline_fn int l7_server_first(struct sk_msg_md *msg, struct l7_replies *r, struct l7_sock_key *key)
{
	__u64 cookie = r->cookie;
	struct l7_conn *c = bpf_map_lookup_elem(&weir_l7_conns, &cookie);
	struct l7_handoff *h;
	struct l7_flow *f;
	__u32 slot, q;

	if (!c || c->closed || c->slot || c->s.offset)
		return SK_PASS;
	f = bpf_map_lookup_elem(&weir_l7_flows, key);
	if (!f)
		return SK_PASS;
	h = l7_slot_take(cookie, key, f->sets, &slot);
	if (!h)
		return SK_PASS;
	l7_slot_serve(h, 0, 0, 0, 1, 0);
	c->slot = slot + 1;
	l7_reply_stop(r, key, f->sets, L7_DIR_INGRESS);
	l7_count(L7_STAT_H2C, 1);
	l7_count(L7_STAT_H2C_SERVER_BYTES, msg->size);
	q = slot * 2 + 1;
	return bpf_msg_redirect_hash(msg, &weir_l7_proxy, &q, BPF_F_INGRESS);
}

/* l7_server_msg passes everything a server sends, and reads the status
 * of the answers to the requests its verdict allowed. What Weir writes
 * in the server's place (l7_http_verdict's answers) comes this way too,
 * when no answer is awaited: it answers a denied request. */
SEC("sk_msg")
int l7_server_msg(struct sk_msg_md *msg)
{
	struct l7_src src = { .msg = msg, .len = msg->size, .is_msg = 1 };
	struct l7_sock_key key;
	struct l7_replies *r;
	struct l7_flow *f;

	/* The socket's own name for the connection is the server's. */
	if (l7_msg_key(msg, &key))
		return SK_PASS;
	r = bpf_map_lookup_elem(&weir_l7_replies, &key);
	if (!r)
		return SK_PASS;
	if (r->lost)
		return l7_server_handed(msg, r->cookie);
	if (!r->waiting && !r->asked_ns)
		return l7_server_first(msg, r, &key);
	if (!r->waiting)
		return SK_PASS;
	f = bpf_map_lookup_elem(&weir_l7_flows, &key);
	if (!f)
		return SK_PASS;
	l7_reply_read(r, &src, &key, f->sets, L7_DIR_INGRESS);
	return SK_PASS;
}

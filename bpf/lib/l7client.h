/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * l7client.h: judging the requests a pod sends, on its own socket, where
 * its egress policy restricts a connection to HTTP rules.
 *
 * When a restricted connection's handshake completes, sock_ops (l7.c)
 * puts the client's socket in weir_l7_client with its reader state in
 * weir_l7_client_conns, and marks its weir_l7_out entry joined with the
 * socket's cookie. From then on every message the application sends
 * runs l7_client_msg before TCP takes it, and the same reader as a
 * server's (lib/http.h, lib/l7http.h) walks its bytes:
 *
 *   - a message whose heads are all allowed passes, and the flow's judged
 *     mark moves past it: tc lets bytes out only below it (l7flow.h);
 *   - a message that ends in the middle of a head is held (corked) until
 *     the rest arrives, and walked on from where it stopped: the head is
 *     judged whole, and no byte of it leaves before;
 *   - a denied head that begins the message is answered in place: the
 *     message is rewritten into a 403 and put on the socket's own receive
 *     queue, so the application reads it as the server's answer; the
 *     connection stays open when the request ended in the message;
 *   - anything else (a denial after allowed bytes in one message, a head
 *     the kernel cannot judge, an earlier answer still to come) closes
 *     the connection: this message and every later one are dropped, and
 *     the application's send fails (EACCES).
 *
 * The socket's skb verdict (l7_client_skb) passes what it receives: with
 * it the socket's received bytes and the answers put on its queue share
 * one queue, in order, and FIONREAD counts them (without it, a socket in
 * a socket hash reports only the answers).
 *
 * The state is keyed by the socket's own name for the connection (the
 * server as remote): the message verdict rebuilds it from its context.
 */
#ifndef WEIR_LIB_L7CLIENT_H
#define WEIR_LIB_L7CLIENT_H

#include "common.h"
#include "l7flow.h"
#include "l7http.h"

/* l7_client is a client socket's reader: a server's (l7_conn), with the
 * cork a split head holds. */
struct l7_client {
	struct l7_conn conn;
	__u64 cookie;
	__u32 walked;   /* bytes of the corked message already walked, 0: none corked */
	__u32 head_pos; /* where in it the head the cork waits for began */
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct l7_sock_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_client SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct l7_sock_key);
	__type(value, struct l7_client);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_client_conns SEC(".maps");

/* Per-CPU room to build a client's reader state in: too large for the
 * stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct l7_client);
} weir_l7_client_scratch SEC(".maps");

/* l7_msg_key names a message's socket as weir_l7_out does (the server as
 * remote); -1 for a socket that is neither IPv4 nor IPv4-mapped. */
__always_inline_fn int l7_msg_key(struct sk_msg_md *msg, struct l7_sock_key *key)
{
	__u32 ffff = bpf_htonl(0xffff);

	if (msg->family == WEIR_AF_INET) {
		key->remote = msg->remote_ip4;
		key->local = msg->local_ip4;
	} else if (msg->family == WEIR_AF_INET6 && ctx_load(msg->remote_ip6[0]) == 0 &&
		   ctx_load(msg->remote_ip6[1]) == 0 && ctx_load(msg->remote_ip6[2]) == ffff &&
		   ctx_load(msg->local_ip6[0]) == 0 && ctx_load(msg->local_ip6[1]) == 0 &&
		   ctx_load(msg->local_ip6[2]) == ffff) {
		key->remote = ctx_load(msg->remote_ip6[3]);
		key->local = ctx_load(msg->local_ip6[3]);
	} else {
		return -1;
	}
	key->remote_port = bpf_ntohs((__u16)(msg->remote_port >> 16));
	key->local_port = (__u16)msg->local_port;
	return 0;
}

/* l7_server_view is the connection as its server names it. */
__always_inline_fn struct l7_sock_key l7_server_view(const struct l7_sock_key *own)
{
	struct l7_sock_key k = {
		.remote = own->local,
		.local = own->remote,
		.remote_port = own->local_port,
		.local_port = own->remote_port,
	};

	return k;
}

/* The answers a client reads in its server's place: the proxy's words
 * (internal/proxy), so a denial reads alike wherever it was made. */
static const char l7_client_403[] =
	"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: 14\r\n\r\nAccess denied\n";
static const char l7_client_403_close[] =
	"HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: 14\r\n\r\nAccess denied\n";
static const char l7_client_400[] =
	"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: 12\r\n\r\nBad request\n";

/* l7_msg_resize makes the message exactly n bytes long and its first n
 * bytes pulled; -1 when it cannot. */
__always_inline_fn int l7_msg_resize(struct sk_msg_md *msg, __u32 n)
{
	__u32 size = msg->size;

	if (size > n && bpf_msg_pop_data(msg, n, size - n, 0))
		return -1;
	if (size < n && bpf_msg_push_data(msg, size, n - size, 0))
		return -1;
	/* push and pop leave the data pointers stale */
	return bpf_msg_pull_data(msg, 0, n, 0) ? -1 : 0;
}

/* L7_MSG_WRITE makes the message exactly the constant string text and
 * evaluates to 0, or to -1 when it cannot (a macro: the copy and the
 * bounds check need text's length as a constant). */
#define L7_MSG_WRITE(msg, text)                                                  \
	({                                                                       \
		int __r = -1;                                                    \
		if (!l7_msg_resize(msg, sizeof(text) - 1)) {                     \
			void *__d = (void *)(long)(msg)->data;                   \
			if (__d + sizeof(text) - 1 <= (void *)(long)(msg)->data_end) { \
				__builtin_memcpy(__d, text, sizeof(text) - 1);   \
				__r = 0;                                         \
			}                                                        \
		}                                                                \
		__r;                                                             \
	})

/* l7_msg_answer rewrites the whole message into an answer: 403 keeping
 * the connection (keep) or closing it, or 400. -1 when it cannot. */
__always_inline_fn int l7_msg_answer(struct sk_msg_md *msg, int status, int keep)
{
	if (status == 400)
		return L7_MSG_WRITE(msg, l7_client_400);
	if (keep)
		return L7_MSG_WRITE(msg, l7_client_403);
	return L7_MSG_WRITE(msg, l7_client_403_close);
}

/* l7_msg_write_seq reads how far the client has written: the sequence
 * number the message's first byte will have. */
__always_inline_fn int l7_msg_write_seq(struct sk_msg_md *msg, __u32 *seq)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(msg->sk);

	if (!tp)
		return -1;
	*seq = tp->write_seq;
	return 0;
}

#endif /* WEIR_LIB_L7CLIENT_H */

/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * l7reset.h: resetting the connections the HTTP verdict has closed.
 *
 * A verdict closes a connection by dropping every later skb (l7http.h),
 * but TCP has already acknowledged those bytes: without more, the client
 * would wait for an answer that never comes and the server for a request.
 * So l7_close lists the socket in weir_l7_closing, and the agent reads
 * l7_reset_tcp (l7.c, iter/tcp) in the namespace of the listed sockets'
 * local address. The iterator aborts each listed socket with
 * bpf_sock_destroy() once what the server owes the client has gone out:
 *
 *   - an answer written in the server's place (403 or 400 closing the
 *     connection) has been sent and acknowledged: the reset must not
 *     overtake it;
 *   - a server that had not yet answered the last request it was given
 *     (a pipelined denial after it) has written since, and all it wrote
 *     is acknowledged: the client gets the answers before the reset and
 *     retries the rest, as HTTP/1.1 lets it after a close;
 *   - or L7_RESET_GRACE_NS have passed since the close, whatever is
 *     still unsent.
 *
 * The client sees ECONNRESET after its last answer, the server
 * ECONNABORTED; both free the connection at once. The entry goes when the
 * socket is reset or closes on its own (l7_closed).
 */
#ifndef WEIR_LIB_L7RESET_H
#define WEIR_LIB_L7RESET_H

#include "common.h"
#include "l7sock.h"

#define L7_RESET_GRACE_NS (5ULL * 1000 * 1000 * 1000)

/* Flags of a listed socket. */
#define L7_CLOSING_SEQ 1  /* seq holds how far the server must have sent */
#define L7_CLOSING_OWES 2 /* the server owed an answer at the close: wait until it writes */
#define L7_CLOSING_GRACE 4 /* what the server owes is unknown: wait out the grace */

/* l7_closing is a socket the verdict closed: its local address (which
 * namespace holds it), when, and what must go out before the reset. */
struct l7_closing {
	__u64 since_ns;
	__u32 local;
	__u32 seq; /* the server's write_seq at the close, plus our answer */
	__u8 flags;
	__u8 pad[7];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); /* socket cookie */
	__type(value, struct l7_closing);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_closing SEC(".maps");

/* The kernel's tcp_sock, only the fields read, relocated by CO-RE. */
struct tcp_sock {
	__u32 write_seq; /* the end of what the application has written */
	__u32 snd_una;   /* the first byte the peer has not acknowledged */
	__u32 rcv_nxt;   /* the next byte expected from the peer */
} __attribute__((preserve_access_index));

/* l7_write_seq reads how far the server has written on the socket the
 * skb is for; -1 when it cannot be read. */
__always_inline_fn int l7_write_seq(struct __sk_buff *skb, __u32 *seq)
{
	struct bpf_sock *sk = skb->sk;
	struct tcp_sock *tp;

	if (!sk)
		return -1;
	tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return -1;
	*seq = tp->write_seq;
	return 0;
}

/* l7_closing_list lists a closed socket for reset. write_seq is the
 * server's at the close (valid when have_seq), answer_len the length of
 * the answer the verdict sends in its place (0: none), owes whether the
 * server had not answered the last request it was given. A full list is
 * counted: that connection waits for its peers' timeouts. */
__always_inline_fn void l7_closing_list(__u64 cookie, __u32 local, int have_seq, __u32 write_seq, __u32 answer_len, int owes)
{
	struct l7_closing e = { .since_ns = bpf_ktime_get_ns(), .local = local };
	long err;

	if (have_seq) {
		e.seq = write_seq + answer_len;
		e.flags = L7_CLOSING_SEQ | (owes ? L7_CLOSING_OWES : 0);
	}
	err = bpf_map_update_elem(&weir_l7_closing, &cookie, &e, BPF_NOEXIST);

	if (err && err != -WEIR_EEXIST) /* listed already: the first close stands */
		l7_count(L7_STAT_RESET_UNLISTED, 1);
}

/* l7_closing_ready says whether a listed socket may be reset now. */
__always_inline_fn int l7_closing_ready(const struct l7_closing *e, struct tcp_sock *tp, __u64 now)
{
	__u32 sent, written;

	if (now - e->since_ns >= L7_RESET_GRACE_NS)
		return 1;
	if (e->flags & L7_CLOSING_GRACE)
		return 0;
	if (!(e->flags & L7_CLOSING_SEQ))
		return 1; /* nothing known to wait for */
	written = tp->write_seq;
	sent = tp->snd_una;
	if (sent != written)
		return 0; /* the peer has not acknowledged all of it */
	if ((__s32)(written - e->seq) < 0)
		return 0; /* our answer is not yet written */
	if ((e->flags & L7_CLOSING_OWES) && written == e->seq)
		return 0; /* the server has not answered yet */
	return 1;
}

#endif /* WEIR_LIB_L7RESET_H */

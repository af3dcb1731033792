/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * l7reply.h: the status and latency of the answers to the requests the
 * kernel allowed.
 *
 * An HTTP/1.1 client that does not pipeline sends a request only once it
 * has read the whole answer to the one before. So on such a connection,
 * after a request went on to the server, the first bytes the server
 * sends begin that request's answer, and every byte it sends before the
 * next request goes on continues it: the answers are framed by the
 * requests, without reading their bodies. The reader looks at the first
 * bytes of the first send after each request ("HTTP/1.1 200"), and at
 * nothing else; its cost does not grow with an answer's size.
 *
 * The server's sends are read where they are made: for a server whose
 * ingress rules judge the requests, by the message verdict of its own
 * socket (l7_server_msg); for a client whose egress rules judge them, by
 * the skb verdict of the client's socket as the answer arrives
 * (l7_client_skb). Either sees the server's bytes in order, each once:
 * the message verdict runs before TCP takes them, the skb verdict before
 * the application reads them, and the client's next request comes only
 * after. Answers Weir writes in the server's place are not the server's:
 * they answer denied requests, which never went on, and are recorded
 * with those requests.
 *
 * Where that framing does not hold, the reader stops rather than guess
 * (l7_replies.lost, counted as replies_lost): a client that sends a
 * request before the answer to the previous one began (pipelining), a
 * send that should begin an answer and does not ("HTTP/1.x NNN"), an
 * answer of 101 (the connection leaves HTTP), and connections handed to
 * user space. Interim answers (1xx) leave the request waiting for its
 * final answer, which may follow in the same send.
 *
 * A client that pipelines after reading only part of an answer, or a
 * server writing a body whose bytes at a send's start read as a status
 * line, can make the records of its own connection's answers wrong; it
 * cannot make a request pass or fail, and no other connection's records
 * change.
 *
 * The state is a socket's own: weir_l7_replies, keyed by the socket's
 * name for its connection (the server's as l7_sock_key names it, or the
 * client's own), which the skb verdicts, the message verdicts and
 * sock_ops can all compute (a message verdict cannot read a socket's
 * cookie, and an skb verdict cannot use socket storage). sock_ops makes
 * it when the socket joins its reader and deletes it when it closes.
 *
 * Answers fold like requests (l7events.h): consecutive answers with the
 * same status, within a second of the first of them, make one run, with
 * their count and the sum and maximum of their latencies. A run rides
 * on the connection's next record, whatever it records (a request, a
 * denial, repeats), before that record's own request counts: so it
 * always answers the connection's last recorded request, which names it
 * (the agent keeps it), and a connection costs no more records than its
 * requests do. A run that must end without a record to ride (its status
 * changes, it is a second old, the connection closes or its answers stop
 * being read) is a record of its own (L7_EV_REPLY).
 */
#ifndef WEIR_LIB_L7REPLY_H
#define WEIR_LIB_L7REPLY_H

#include "common.h"
#include "l7events.h"

/* "HTTP/1.x NNN": the bytes a status read needs. */
#define L7_REPLY_LINE 12
/* Where the end of an interim answer's head is looked for. */
#define L7_REPLY_INTERIM 64

/* l7_replies is the answer side of one connection. */
struct l7_replies {
	__u64 cookie;   /* the socket's, which records name the connection by */
	__u64 asked_ns; /* when the request whose answer is awaited went on */
	__u64 first_ns; /* the run's first answer's time */
	__u64 last_ns;  /* its last's */
	__u64 sum_ns;   /* the latencies of the run's answers, summed */
	__u64 max_ns;   /* and their maximum */
	__u32 count;    /* answers in the run, not yet recorded */
	__u16 status;   /* the run's status */
	__u8 waiting;   /* a request went on and its answer has not begun */
	__u8 lost;      /* answers are no longer read (see above) */
};

struct {
	/* LRU: an entry left by a socket whose close went unseen (a version
	 * without this map ran meanwhile) makes room; a live connection's
	 * entry evicted only has its answers not read. */
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct l7_sock_key);
	__type(value, struct l7_replies);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_replies SEC(".maps");

/* l7_replies_make gives a socket that joined a reader its answer side;
 * one that cannot have it (a full map) has its answers not read. */
__always_inline_fn void l7_replies_make(const struct l7_sock_key *own, __u64 cookie)
{
	struct l7_replies r = { .cookie = cookie };

	if (bpf_map_update_elem(&weir_l7_replies, own, &r, BPF_ANY))
		l7_count(L7_STAT_REPLIES_LOST, 1);
}

/* l7_reply_attach puts the run of answers, if any, on a record being
 * written, and ends it. */
__always_inline_fn void l7_reply_attach(struct l7_replies *r, struct l7_request_event *ev)
{
	if (!r || !r->count)
		return;
	ev->replies = r->count;
	ev->status = r->status;
	ev->latency_ns = r->sum_ns;
	ev->latency_max_ns = r->max_ns;
	r->count = 0;
}

/* l7_reply_flush records the run of answers, if any, on a record of its
 * own, and ends it. */
__always_inline_fn void l7_reply_flush(struct l7_replies *r, const struct l7_sock_key *key, const __u32 *sets,
				       __u8 dir)
{
	struct l7_request_event *ev;

	if (!r || !r->count)
		return;
	ev = l7_event_reserve(key, r->cookie, sets, dir);
	if (ev) {
		ev->ts_ns = r->last_ns;
		ev->verdict = L7_EV_REPLY;
		ev->count = 0;
		l7_reply_attach(r, ev);
		l7_event_submit(ev);
	}
	r->count = 0;
}

/* l7_reply_stop stops reading the connection's answers, recording the
 * run first. */
__always_inline_fn void l7_reply_stop(struct l7_replies *r, const struct l7_sock_key *key, const __u32 *sets,
				      __u8 dir)
{
	if (!r || r->lost)
		return;
	l7_reply_flush(r, key, sets, dir);
	r->lost = 1;
	r->waiting = 0;
	l7_count(L7_STAT_REPLIES_LOST, 1);
}

/* l7_reply_asked notes that an allowed request went on to the server:
 * the next bytes the server sends begin its answer. A request that goes
 * on while the answer to the one before has not begun is pipelined. */
__always_inline_fn void l7_reply_asked(struct l7_replies *r, const struct l7_sock_key *key, const __u32 *sets,
				       __u8 dir)
{
	if (!r || r->lost)
		return;
	if (r->waiting) {
		l7_reply_stop(r, key, sets, dir);
		return;
	}
	r->waiting = 1;
	r->asked_ns = bpf_ktime_get_ns();
}

/* l7_status_at reads the status of a status line at off of src
 * ("HTTP/1.x NNN"); -1 when the bytes there are not one. */
__always_inline_fn int l7_status_at(const struct l7_src *src, __u32 off)
{
	__u8 b[L7_REPLY_LINE];
	int i, status = 0;

	if ((__u64)off + L7_REPLY_LINE > src->len || l7_src_load(src, off, b, L7_REPLY_LINE))
		return -1;
	if (b[0] != 'H' || b[1] != 'T' || b[2] != 'T' || b[3] != 'P' || b[4] != '/' || b[5] != '1' || b[6] != '.' ||
	    b[7] < '0' || b[7] > '9' || b[8] != ' ')
		return -1;
	for (i = 9; i < L7_REPLY_LINE; i++) {
		if (b[i] < '0' || b[i] > '9')
			return -1;
		status = status * 10 + b[i] - '0';
	}
	/* RFC 9110's range: a server cannot fill the status label of the
	 * metrics with 900 values. */
	if (status < 100 || status > 599)
		return -1;
	return status;
}

/* l7_interim_end finds where an interim answer's head that begins src
 * ends (the byte after its blank line), within its first
 * L7_REPLY_INTERIM bytes; 0 when it does not end there. */
__always_inline_fn __u32 l7_interim_end(const struct l7_src *src)
{
	__u8 b[L7_REPLY_INTERIM];
	__u32 n = src->len, i;

	if (n > L7_REPLY_INTERIM)
		n = L7_REPLY_INTERIM;
	if (n < 4)
		return 0;
	/* n is 4 to L7_REPLY_INTERIM here; the mask says so to the verifier. */
	n = ((n - 1) & (L7_REPLY_INTERIM - 1)) + 1;
	if (l7_src_load(src, 0, b, n))
		return 0;
	for (i = 3; i < L7_REPLY_INTERIM; i++) {
		if (i >= n)
			break;
		if (b[i - 3] == '\r' && b[i - 2] == '\n' && b[i - 1] == '\r' && b[i] == '\n')
			return i + 1;
	}
	return 0;
}

/* l7_reply_answered adds an answer of status to the run: a run holds
 * answers of one status, for a second at most. */
__always_inline_fn void l7_reply_answered(struct l7_replies *r, int status, const struct l7_sock_key *key,
					  const __u32 *sets, __u8 dir)
{
	__u64 now = bpf_ktime_get_ns(), lat = now - r->asked_ns;

	r->waiting = 0;
	l7_count(L7_STAT_REPLIES, 1);
	if (r->count && (r->status != status || now - r->first_ns >= L7_RUN_NS))
		l7_reply_flush(r, key, sets, dir);
	if (!r->count) {
		r->first_ns = now;
		r->sum_ns = 0;
		r->max_ns = 0;
		r->status = status;
	}
	r->count++;
	r->last_ns = now;
	r->sum_ns += lat;
	if (lat > r->max_ns)
		r->max_ns = lat;
}

/* l7_reply_read reads what the server sent, src, on a connection whose
 * answers are read: the start of the answer awaited, or more of the
 * last one. key names the connection as its server does. */
__always_inline_fn void l7_reply_read(struct l7_replies *r, const struct l7_src *src, const struct l7_sock_key *key,
				      const __u32 *sets, __u8 dir)
{
	__u32 off = 0;
	int status;

	if (!r || r->lost || !r->waiting || !src->len)
		return;
	status = l7_status_at(src, 0);
	if (status >= 100 && status < 200 && status != 101) {
		/* An interim answer: the final one may follow in this send. */
		off = l7_interim_end(src);
		if (!off || off >= src->len)
			return;
		status = l7_status_at(src, off);
		if (status >= 100 && status < 200 && status != 101)
			return; /* another interim answer: wait for the next send */
	}
	if (status < 0) {
		l7_reply_stop(r, key, sets, dir);
		return;
	}
	l7_reply_answered(r, status, key, sets, dir);
	if (status == 101)
		l7_reply_stop(r, key, sets, dir); /* the connection leaves HTTP */
}

/* l7_replies_of returns the answer side of the socket named own or, for
 * a socket that has none (it joined when the map was full, or before
 * this version), the entry of the key no socket has (all zero), which is
 * always lost: nothing reads or writes answers through it. So the walk's
 * pointer is never NULL and always into this one map, and the verifier
 * does not verify the request walk once for each kind of pointer. NULL
 * only when neither entry can be had. */
__always_inline_fn struct l7_replies *l7_replies_of(const struct l7_sock_key *own)
{
	struct l7_replies *r = bpf_map_lookup_elem(&weir_l7_replies, own), lost = { .lost = 1 };
	struct l7_sock_key none = {};

	if (r)
		return r;
	r = bpf_map_lookup_elem(&weir_l7_replies, &none);
	if (!r) {
		bpf_map_update_elem(&weir_l7_replies, &none, &lost, BPF_NOEXIST);
		r = bpf_map_lookup_elem(&weir_l7_replies, &none);
	}
	if (r) {
		r->lost = 1;
		r->count = 0;
	}
	return r;
}

#endif /* WEIR_LIB_L7REPLY_H */

/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * l7events.h: a record of the requests the HTTP verdict judges.
 *
 * weir_l7_events: ring buffer of struct l7_request_event, read by the
 * agent into flow records (`weir observe --http`). Every request the
 * verdict judges is in a record: its request line's first bytes and its
 * Host name as they arrived, the verdict, and what decided it (the HTTP
 * set and the index of its rule that allowed it).
 *
 * Requests that repeat one another are counted, not copied: on one
 * connection, a request the rules see as the last one's (the same
 * method, canonical path and host, allowed by the same rule) within a
 * second of the first of them adds to the connection's run
 * (l7_conn.run). The run's first request is recorded when it comes; its
 * repeats in one record without text (L7_EVF_REPEAT, count, the cookie
 * names the connection whose last record they repeat) when the
 * connection sends another request, when the run is a second old at its
 * next request, or when the socket closes. A keep-alive client repeating
 * one call costs a record a second, not one per request. Denials,
 * refusals and punts are always recorded one by one. The server's
 * answers to allowed requests are counted in runs too, and ride on the
 * connection's next record (l7reply.h).
 *
 * A full ring loses the record, never the request's verdict; the loss is
 * counted (L7_STAT_EVENTS_LOST).
 */
#ifndef WEIR_LIB_L7EVENTS_H
#define WEIR_LIB_L7EVENTS_H

#include "common.h"
#include "http.h"
#include "l7flow.h"
#include "l7sock.h"

#define L7_EVENT_LINE 128 /* bytes of the head kept: the request line, or its start */
#define L7_EVENT_HOST 64  /* bytes of the Host name kept */
#define L7_RUN_NS 1000000000ULL

/* What a record says of its requests (l7_request_event.verdict). */
enum {
	L7_EV_ALLOWED = 1,
	L7_EV_DENIED,  /* no rule allows it */
	L7_EV_REFUSED, /* the stream cannot be read safely (400) */
	L7_EV_PUNTED,  /* the kernel cannot judge it */
	L7_EV_SPLIT,   /* its head did not end in the skb it began in */
	L7_EV_REPLY,   /* only the server's answers (replies), no request (l7reply.h) */
};

/* l7_request_event.flags */
#define L7_EVF_REPEAT 0x01   /* count repeats of the connection's last record; no text */
#define L7_EVF_ANSWERED 0x02 /* answered in place (403, 400) */
#define L7_EVF_CLOSED 0x04   /* the connection carries no more bytes */
#define L7_EVF_LINE_CUT 0x08 /* more of the skb followed than line[] keeps */
#define L7_EVF_UPGRADE 0x10  /* punted: an allowed request to upgrade the connection */
#define L7_EVF_USER_RULES 0x20 /* punted: only rules the kernel does not judge may match */
#define L7_EVF_PIPELINED 0x40 /* not answered: the answer to an earlier request is still to come */
#define L7_EVF_HANDED 0x80 /* handed to user space, which judges it (lib/l7proxy.h) */

/* Whose policy a record's request was judged by (l7_request_event.dir):
 * the server's ingress rules, read by its socket's verdict, or the
 * client's egress rules, read by its socket's message verdict. */
#define L7_DIR_INGRESS 0
#define L7_DIR_EGRESS 1

struct l7_request_event {
	__u64 ts_ns;  /* the (last) request's time */
	__u64 cookie; /* the judging socket's: the server's, or for egress the client's */
	__be32 client;
	__be32 server;
	__u16 client_port; /* host order */
	__u16 server_port;
	__u32 sets[L7_FLOW_SETS]; /* the flow's sets it was judged against */
	__u32 set;    /* the set whose rule allowed it, 0: none */
	__u32 count;  /* requests it stands for */
	__u8 verdict; /* L7_EV_* */
	__u8 rule;    /* the allowing rule's index in set */
	__u8 error;   /* the reader's HTTP_ERR_ or HTTP_PUNT_ code */
	__u8 flags;   /* L7_EVF_* */
	__u16 line_len;
	__u8 host_len;
	__u8 dir;     /* L7_DIR_*: whose policy judged it */
	/* The server's answers since the connection's last record, to its
	 * last recorded request (l7reply.h), on any record: how many (0:
	 * none), their status, and the sum and maximum of their latencies
	 * (from the request going on to the answer's first byte). */
	__u16 status;
	__u16 pad;
	__u32 replies;
	__u64 latency_ns;
	__u64 latency_max_ns;
	__u8 line[L7_EVENT_LINE];
	__u8 host[L7_EVENT_HOST];
};

/* The ring buffer has no value type; this keeps the event's layout in BTF
 * for the Go reader's generated struct. */
const struct l7_request_event *unused_l7_request_event __attribute__((unused));

#define L7_EVENTS_RING_SIZE (1 << 21)

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, L7_EVENTS_RING_SIZE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_events SEC(".maps");

/* l7_run is one connection's run of repeated requests. */
struct l7_run {
	__u64 key;      /* l7_run_key of its requests; 0: no run */
	__u64 first_ns; /* its first request's time */
	__u64 last_ns;  /* its last's */
	__u32 set;
	__u32 repeats;  /* requests after the first, not yet recorded */
	__u8 rule;
	__u8 pad[7];
};

/* l7_run_key names a request as the rules see it, and what allowed it. */
__always_inline_fn __u64 l7_run_key(struct http_state *s, __u32 set, __u8 rule)
{
	__u64 k = s->path_hash, h = FNV_OFFSET;
	int i;

	for (i = 0; i < HTTP_MAX_METHOD; i++) {
		if (i >= s->method_len)
			break;
		h = fnv(h, s->method[i]);
	}
	k = (k ^ h) * FNV_PRIME;
	for (i = 0; i < HTTP_MAX_LABELS; i++) {
		if (i >= s->labels)
			break;
		k = (k ^ s->label[i]) * FNV_PRIME;
	}
	k = (k ^ (((__u64)set << 8) | rule)) * FNV_PRIME;
	return k ? k : 1;
}

/* l7_event_emit writes a reserved record without waking the reader (the
 * agent polls), unless an eighth of the ring is waiting. */
__always_inline_fn void l7_event_submit(struct l7_request_event *ev)
{
	__u64 flags = BPF_RB_NO_WAKEUP;

	if (bpf_ringbuf_query(&weir_l7_events, BPF_RB_AVAIL_DATA) > L7_EVENTS_RING_SIZE / 8)
		flags = BPF_RB_FORCE_WAKEUP;
	bpf_ringbuf_submit(ev, flags);
}

/* l7_event_reserve reserves a record with the connection's tuple (key
 * as the server names it) and direction, or counts its loss and returns
 * NULL. */
__always_inline_fn struct l7_request_event *l7_event_reserve(const struct l7_sock_key *key, __u64 cookie,
							      const __u32 *sets, __u8 dir)
{
	struct l7_request_event *ev = bpf_ringbuf_reserve(&weir_l7_events, sizeof(*ev), 0);

	if (!ev) {
		l7_count(L7_STAT_EVENTS_LOST, 1);
		return NULL;
	}
	/* Everything before the text is set here; the text is written, or
	 * its length left 0, by l7_event_text. */
	__builtin_memset(ev, 0, offsetof(struct l7_request_event, line));
	ev->ts_ns = bpf_ktime_get_ns();
	ev->cookie = cookie;
	ev->client = key->remote;
	ev->server = key->local;
	ev->client_port = key->remote_port;
	ev->server_port = key->local_port;
	ev->sets[0] = sets[0];
	ev->sets[1] = sets[1];
	ev->sets[2] = sets[2];
	ev->count = 1;
	ev->dir = dir;
	return ev;
}

/* l7_event_repeats records a run's repeats, if any, and ends the run. */
__always_inline_fn void l7_event_repeats(struct l7_run *run, const struct l7_sock_key *key, __u64 cookie,
					 const __u32 *sets, __u8 dir)
{
	struct l7_request_event *ev;

	if (run->key && run->repeats) {
		ev = l7_event_reserve(key, cookie, sets, dir);
		if (ev) {
			ev->ts_ns = run->last_ns;
			ev->verdict = L7_EV_ALLOWED;
			ev->flags = L7_EVF_REPEAT;
			ev->set = run->set;
			ev->rule = run->rule;
			ev->count = run->repeats;
			l7_event_submit(ev);
		}
	}
	run->key = 0;
	run->repeats = 0;
}

/* l7_msg_load copies n bytes (1 to L7_EVENT_LINE) at off of a message
 * into buf: the message's data pointers cover only what was pulled, so
 * the bytes are pulled first (no copy when they lie in one of its
 * pages). */
__always_inline_fn long l7_msg_load(struct sk_msg_md *msg, __u32 off, void *buf, __u32 n)
{
	void *d, *end;
	long err;

	if (n < 1 || n > L7_EVENT_LINE)
		return -1;
	err = bpf_msg_pull_data(msg, off, off + n, 0);
	if (err)
		return err;
	d = (void *)(long)msg->data;
	end = (void *)(long)msg->data_end;
	if (d + n > end)
		return -1;
	return bpf_probe_read_kernel(buf, n, d);
}

/* l7_src is what a verdict reads: a received skb, or a message being
 * sent (is_msg: msg set, skb NULL), of len bytes. */
struct l7_src {
	struct __sk_buff *skb;
	struct sk_msg_md *msg;
	__u32 len;
	__u32 is_msg;
};

/* l7_src_load copies n bytes (1 to L7_EVENT_LINE) at off of src. */
__always_inline_fn long l7_src_load(const struct l7_src *src, __u32 off, void *buf, __u32 n)
{
	if (src->is_msg)
		return l7_msg_load(src->msg, off, buf, n);
	return bpf_skb_load_bytes(src->skb, off, buf, n);
}

/* l7_event_text copies what arrived of the head at offset at of src: its
 * first bytes (the request line) and, when it lies in src, the Host
 * name. */
__always_inline_fn void l7_event_text(struct l7_request_event *ev, const struct l7_src *src, __u32 at,
				      struct http_state *s)
{
	__u32 n, h, len = src->len;

	if (at >= len)
		return;
	n = len - at;
	if (n > L7_EVENT_LINE) {
		n = L7_EVENT_LINE;
		ev->flags |= L7_EVF_LINE_CUT;
	}
	/* n is 1 to L7_EVENT_LINE here; the mask says so to the verifier. */
	n = ((n - 1) & (L7_EVENT_LINE - 1)) + 1;
	if (!l7_src_load(src, at, ev->line, n))
		ev->line_len = n;
	if (!s->host_count || !s->host_len)
		return;
	h = s->host_len;
	if (h > L7_EVENT_HOST)
		h = L7_EVENT_HOST;
	if ((__u64)at + s->host_at + h > len)
		return;
	h = ((h - 1) & (L7_EVENT_HOST - 1)) + 1;
	if (!l7_src_load(src, at + s->host_at, ev->host, h))
		ev->host_len = h;
}

#endif /* WEIR_LIB_L7EVENTS_H */

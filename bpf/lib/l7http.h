/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * l7http.h: judging the requests of a socket in weir_l7_http.
 *
 * Each skb the socket receives is walked with its reader (lib/http.h,
 * state in weir_l7_conns by socket cookie): body bytes are skipped, head
 * bytes read, and each head that ends is judged against the socket's
 * HTTP set (lib/l7match.h). The skb passes to the application when every
 * head in it is allowed and none is left unfinished at its end. Else:
 *
 *   - a head denied (403) or a stream refused (400) that begins the skb
 *     is answered in place: the skb is rewritten into the response,
 *     exactly as long (docs/l7.md: a longer one stops the socket's
 *     receive side), and redirected to the socket's own egress;
 *   - anything else (a denied head after allowed bytes in one skb, a
 *     head split over skbs, a head the kernel cannot judge, an skb too
 *     short for an answer) is dropped.
 *
 * After a refusal, a punt or a split head the connection is closed to
 * the application: every later skb is dropped, so no partial or denied
 * head is ever completed by bytes that follow it. An answer that says
 * "Connection: close" closes it too; the short answer (no room for that
 * field) leaves the connection open only when the denied head was the
 * whole skb and has no body.
 */
#ifndef WEIR_LIB_L7HTTP_H
#define WEIR_LIB_L7HTTP_H

#include "common.h"
#include "http.h"
#include "l7events.h"
#include "l7match.h"
#include "l7reply.h"
#include "l7reset.h"
#include "l7sock.h"

/* l7_conn is one socket's reader. What its requests are judged against
 * is its flow's entry (lib/l7flow.h), read on every skb. */
struct l7_conn {
	struct http_state s;
	__u8 closed;      /* later skbs are dropped */
	__u8 outstanding; /* an allowed request went on (l7_answer_safe) */
	__u16 slot;       /* the hand-off slot + 1 (lib/l7proxy.h), 0: judged here */
	__u32 seq_at_allow; /* the server's write_seq when it went */
	struct l7_run run; /* its requests repeating one another (l7events.h) */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct l7_conn);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_conns SEC(".maps");

/* What a walk ends in. */
enum {
	L7_WALK_PASS,
	L7_WALK_DENY,
	L7_WALK_REFUSE,
	L7_WALK_PUNT,
};

#define L7_WINDOW 64
#define L7_NO_HEAD 0xffffffff

/* l7_walk is a walk over one skb a server's socket receives or, with
 * msg set instead, one message a client's socket sends (l7client.h). */
struct l7_walk {
	struct __sk_buff *skb;
	struct sk_msg_md *msg;
	/* L7_DIR_*: ingress reads skb, egress msg. A whole stack slot that
	 * nothing writes after the start: the verifier keeps knowing its
	 * constant (a write to any byte of a slot forgets it), so each
	 * program is verified only along its own source's branches. */
	__u64 dir;
	struct l7_conn *conn;
	struct l7_replies *replies; /* the connection's answer side, NULL: none (l7reply.h) */
	__u64 cookie;
	struct l7_sock_key key; /* the connection as its server names it, for records */
	__u32 sets[L7_FLOW_SETS]; /* the flow's, as l7flow.h */
	__u32 pos, len;
	__u32 wstart, wlen;
	__u32 head_pos; /* offset of the head being read, L7_NO_HEAD if none began here */
	__u8 outcome;
	__u8 punt_why; /* L7_EVF_UPGRADE or L7_EVF_USER_RULES for a punt the reader did not make */
	__u8 pad[2];
	__u8 win[L7_WINDOW];
};

/* The window is read a byte at a variable offset. Misaligned by 4 bytes
 * (a field of 20 bytes added before it), the verifier tracks its stack
 * slots so much less exactly that both request walks go past a million
 * instructions (598K and 670K aligned): keep it 8-aligned. */
_Static_assert(offsetof(struct l7_walk, win) % 8 == 0, "l7_walk.win must stay 8-aligned");

/* l7_walk_src is what the walk reads, for l7events.h. */
__always_inline_fn struct l7_src l7_walk_src(struct l7_walk *w)
{
	struct l7_src src = { .skb = w->skb, .msg = w->msg, .len = w->len, .is_msg = w->dir == L7_DIR_EGRESS };

	return src;
}

/* l7_peer_seq reads how far the peer of a walk's verdict stands, the
 * sequence number an answer of its own moves: for a server's skb how far
 * the server has written, for a client's message how far the client has
 * received. -1 when it cannot be read. */
__always_inline_fn int l7_peer_seq(struct l7_walk *w, __u32 *seq)
{
	struct tcp_sock *tp;

	if (w->dir != L7_DIR_EGRESS)
		return l7_write_seq(w->skb, seq);
	tp = bpf_skc_to_tcp_sock(w->msg->sk);
	if (!tp)
		return -1;
	*seq = tp->rcv_nxt;
	return 0;
}

/* l7_request_went notes that an allowed request went on to the server,
 * and how far the answering side stood then (l7_peer_seq): its answer
 * is the next the server sends. */
__always_inline_fn void l7_request_went(struct l7_walk *w)
{
	__u32 seq = 0;

	l7_reply_asked(w->replies, &w->key, w->sets, w->dir);
	w->conn->outstanding = 1;
	if (l7_peer_seq(w, &seq))
		seq = 0;
	w->conn->seq_at_allow = seq;
}

/*
 * l7_answer_safe says whether an answer written in the server's place
 * now would reach the client in its turn. A client that pipelines sends
 * a request before the answer to the one before it: if the server has
 * written nothing since the last request went on (for a client's own
 * message: the client has received nothing since), its answer is still
 * to come, and an answer of ours would come first (paired by the client
 * with the earlier request) or land in the middle of it. Then the
 * connection is closed instead. A server that has written since may be
 * mid-way through a long answer to a pipelined request; only a client
 * that pipelines can meet that, and only then (docs/l7.md). Where the
 * answers are read (lib/l7reply.h), a final answer still awaited is
 * known for sure: the server may have written an interim one (100
 * Continue), which moves its sequence but leaves the answer to come.
 */
__always_inline_fn int l7_answer_safe(struct l7_walk *w)
{
	__u32 seq;

	if (w->replies->waiting)
		return 0;
	if (!w->conn->outstanding)
		return 1;
	if (l7_peer_seq(w, &seq))
		return 0;
	return seq != w->conn->seq_at_allow;
}

/* l7_judge_sets decides a head against a flow's sets: refused when one
 * set refuses it, allowed when one set allows it, to user space when
 * none does and one leaves it there, else denied. Sets all 0: the flow is not restricted. When allowed,
 * *set and *rule name the rule that allowed it (*set 0: unrestricted). */
__always_inline_fn int l7_judge_sets(const __u32 *sets, struct http_state *s, __u32 *set, __u8 *rule)
{
	int i, v, out = L7_DENY;

	*set = 0;
	*rule = 0;
	if (!sets[0] && !sets[1] && !sets[2])
		return L7_ALLOW;
	/* Conditional cluster rules: user space walks the tiers. */
	if ((sets[0] | sets[1] | sets[2]) & L7_SET_TIERED)
		return L7_USER_SPACE;
	for (i = 0; i < L7_FLOW_SETS; i++) {
		if (!sets[i])
			continue;
		v = l7_judge(sets[i], s, rule);
		if (v == L7_REFUSE)
			return L7_REFUSE; /* ambiguous to one policy: to all */
		if (v == L7_ALLOW) {
			*set = sets[i];
			return L7_ALLOW;
		}
		if (v == L7_USER_SPACE)
			out = L7_USER_SPACE;
	}
	return out;
}

/* l7_byte returns the byte at w->pos through a window of loads. */
__always_inline_fn int l7_byte(struct l7_walk *w, __u8 *c)
{
	struct l7_src src = l7_walk_src(w);

	if (w->pos < w->wstart || w->pos >= w->wstart + w->wlen) {
		w->wstart = w->pos;
		if (w->len - w->pos >= L7_WINDOW) {
			if (l7_src_load(&src, w->pos, w->win, L7_WINDOW))
				return -1;
			w->wlen = L7_WINDOW;
		} else {
			/* The rest, 1 to L7_WINDOW - 1 bytes, in one load: a
			 * request shorter than the window (most are) was loaded
			 * a byte a helper call, half the verdict's time (bench
			 * l7: 4.1 to 2.1 us a request). The mask says the bound
			 * to the verifier. */
			__u32 n = w->len - w->pos;

			n = ((n - 1) & (L7_WINDOW - 1)) + 1;
			if (l7_src_load(&src, w->pos, w->win, n))
				return -1;
			w->wlen = n;
		}
	}
	*c = w->win[(w->pos - w->wstart) & (L7_WINDOW - 1)];
	return 0;
}

/* l7_record_allowed records an allowed request, or counts it into its
 * connection's run when it repeats the run's requests (l7events.h). */
__always_inline_fn void l7_record_allowed(struct l7_walk *w, struct http_state *s, __u32 set, __u8 rule)
{
	struct l7_run *run = &w->conn->run;
	struct l7_request_event *ev;
	__u64 now = bpf_ktime_get_ns();
	__u64 key = l7_run_key(s, set, rule);

	if (run->key == key && now - run->first_ns < L7_RUN_NS) {
		run->repeats++;
		run->last_ns = now;
		return;
	}
	l7_event_repeats(run, &w->key, w->cookie, w->sets, w->dir);
	ev = l7_event_reserve(&w->key, w->cookie, w->sets, w->dir);
	if (ev) {
		struct l7_src src = l7_walk_src(w);

		/* The answers so far, to the requests recorded so far. */
		l7_reply_attach(w->replies, ev);
		ev->ts_ns = now;
		ev->verdict = L7_EV_ALLOWED;
		ev->set = set;
		ev->rule = rule;
		l7_event_text(ev, &src, w->head_pos, s);
		l7_event_submit(ev);
	}
	run->key = key;
	run->first_ns = run->last_ns = now;
	run->set = set;
	run->rule = rule;
	run->repeats = 0;
}

static long l7_step(__u32 i, void *data)
{
	struct l7_walk *w = data;
	struct http_state *s = &w->conn->s;
	__u32 n, set;
	__u8 c, rule;
	long r;

	if (w->pos >= w->len)
		return 1;
	if (s->state == HS_BODY || s->state == HS_CHUNK_DATA) {
		w->pos += http_skip(s, w->len - w->pos);
		return 0;
	}
	if (l7_byte(w, &c)) {
		w->outcome = L7_WALK_REFUSE;
		return 1;
	}
	/* A run of a value nothing reads, within the loaded window. */
	n = http_take_value_run(s, w->win, w->pos - w->wstart, L7_WINDOW - 1,
				(w->len < w->wstart + w->wlen ? w->len : w->wstart + w->wlen) - w->pos);
	if (n) {
		w->pos += n;
		return 0;
	}
	if (s->state == HS_IDLE && c != '\r')
		w->head_pos = w->pos;
	r = http_feed_byte(s, c);
	w->pos++;
	switch (r) {
	case HTTP_HEAD_DONE:
		switch (l7_judge_sets(w->sets, s, &set, &rule)) {
		case L7_ALLOW:
			if (s->flags & HTTP_FLAG_UPGRADE) {
				/* After a 101 the bytes are no longer HTTP, and a
				 * server that declines the upgrade stays in HTTP:
				 * only the answer tells which, so user space decides. */
				l7_count(L7_STAT_PUNTED, 1);
				w->outcome = L7_WALK_PUNT;
				w->punt_why = L7_EVF_UPGRADE;
				return 1;
			}
			l7_count(L7_STAT_ALLOWED, 1);
			l7_request_went(w);
			l7_record_allowed(w, s, set, rule);
			w->head_pos = L7_NO_HEAD;
			return 0;
		case L7_DENY:
			l7_count(L7_STAT_DENIED, 1);
			w->outcome = L7_WALK_DENY;
			return 1;
		case L7_REFUSE:
			/* The head is read: the refusal's stream ends where it
			 * began (unit_start), as a reader's own does. */
			http_fail(s, HTTP_ERR_HEADER_REPEATED);
			l7_count(L7_STAT_REFUSED, 1);
			w->outcome = L7_WALK_REFUSE;
			return 1;
		}
		l7_count(L7_STAT_PUNTED, 1);
		w->outcome = L7_WALK_PUNT;
		w->punt_why = L7_EVF_USER_RULES;
		return 1;
	case HTTP_ERROR:
		l7_count(L7_STAT_REFUSED, 1);
		w->outcome = L7_WALK_REFUSE;
		return 1;
	case HTTP_PUNT:
		l7_count(L7_STAT_PUNTED, 1);
		w->outcome = L7_WALK_PUNT;
		return 1;
	}
	return 0;
}

/* The answers. The long form closes the connection and pads its body;
 * under its length the reason phrase takes the slack, with
 * "Connection: close" from 53 bytes and without it from 35. Content
 * length is written with five digits, leading zeros allowed (RFC 9110
 * section 8.6), so the head's length does not depend on the body's. */
static const char l7_answer_long_403[] =
	"HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: 00000\r\n\r\n";
static const char l7_answer_long_400[] =
	"HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: 00000\r\n\r\n";
static const char l7_answer_short_tail[] = "\r\nContent-Length:0\r\n\r\n";
static const char l7_answer_close_tail[] = "\r\nConnection:close\r\nContent-Length:0\r\n\r\n";
static const char l7_pad[L7_WINDOW] =
	"                                                               \n";

#define L7_LONG_403 (sizeof(l7_answer_long_403) - 1)
#define L7_LONG_400 (sizeof(l7_answer_long_400) - 1)
#define L7_SHORT_HEAD 13 /* "HTTP/1.1 403 " */
#define L7_SHORT_TAIL (sizeof(l7_answer_short_tail) - 1)
#define L7_SHORT_MIN (L7_SHORT_HEAD + L7_SHORT_TAIL)
#define L7_CLOSE_TAIL (sizeof(l7_answer_close_tail) - 1)
#define L7_CLOSE_MIN (L7_SHORT_HEAD + L7_CLOSE_TAIL)
#define L7_MAX_ANSWER 65535

struct l7_pad_fill {
	struct __sk_buff *skb;
	__u32 at, to;
};

/* l7_pad_step writes one window of spaces, or one space when less than
 * a window is left. */
static long l7_pad_step(__u32 i, void *data)
{
	struct l7_pad_fill *f = data;

	if (f->at >= f->to)
		return 1;
	if (f->to - f->at >= L7_WINDOW) {
		bpf_skb_store_bytes(f->skb, f->at, l7_pad, L7_WINDOW, 0);
		f->at += L7_WINDOW;
	} else {
		bpf_skb_store_bytes(f->skb, f->at, l7_pad, 1, 0);
		f->at++;
	}
	return 0;
}

/* l7_fill pads [from, to) of the skb with spaces. */
__always_inline_fn void l7_fill(struct __sk_buff *skb, __u32 from, __u32 to)
{
	struct l7_pad_fill f = { .skb = skb, .at = from, .to = to };

	bpf_loop(L7_MAX_ANSWER, l7_pad_step, &f, 0);
}

/* l7_answer_room says what answer the skb has room for: 1 one that
 * closes the connection, 0 one that leaves it open, -1 none. */
__always_inline_fn int l7_answer_room(struct __sk_buff *skb, int status)
{
	__u32 len = skb->len;

	if (len >= (status == 403 ? L7_LONG_403 : L7_LONG_400) && len <= L7_MAX_ANSWER)
		return 1;
	if (len < L7_SHORT_MIN || len > 512)
		return -1;
	return len >= L7_CLOSE_MIN ? 1 : 0;
}

/* l7_answer rewrites the whole skb into a response of its length:
 * status 403 or 400. It returns 1 when the answer closes the connection,
 * 0 when it leaves it open, -1 when the skb cannot hold an answer
 * (as l7_answer_room). */
__always_inline_fn int l7_answer(struct __sk_buff *skb, int status)
{
	__u32 len = skb->len, head, body, i;
	char digits[5];

	head = status == 403 ? L7_LONG_403 : L7_LONG_400;
	if (len >= head && len <= L7_MAX_ANSWER) {
		if (status == 403)
			bpf_skb_store_bytes(skb, 0, l7_answer_long_403, L7_LONG_403, 0);
		else
			bpf_skb_store_bytes(skb, 0, l7_answer_long_400, L7_LONG_400, 0);
		body = len - head;
		for (i = 0; i < 5; i++) {
			digits[4 - i] = '0' + body % 10;
			body /= 10;
		}
		/* the digits sit before the final "\r\n\r\n" */
		bpf_skb_store_bytes(skb, head - 9, digits, 5, 0);
		l7_fill(skb, head, len);
		return 1;
	}
	if (len < L7_SHORT_MIN || len > 512)
		return -1;
	/* Shorter than the long form: the reason phrase takes the slack. */
	bpf_skb_store_bytes(skb, 0, status == 403 ? "HTTP/1.1 403 " : "HTTP/1.1 400 ", L7_SHORT_HEAD, 0);
	if (len >= L7_CLOSE_MIN) {
		l7_fill(skb, L7_SHORT_HEAD, len - L7_CLOSE_TAIL);
		bpf_skb_store_bytes(skb, (len - L7_CLOSE_TAIL) & 511, l7_answer_close_tail, L7_CLOSE_TAIL, 0);
		return 1;
	}
	l7_fill(skb, L7_SHORT_HEAD, len - L7_SHORT_TAIL);
	bpf_skb_store_bytes(skb, (len - L7_SHORT_TAIL) & 511, l7_answer_short_tail, L7_SHORT_TAIL, 0);
	return 0;
}

#endif /* WEIR_LIB_L7HTTP_H */

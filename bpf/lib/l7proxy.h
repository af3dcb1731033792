/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * l7proxy.h: handing a connection's request stream to user space.
 *
 * What the kernel reader cannot judge whole (a head split over two skbs,
 * a rule it leaves to user space, a head it punts) is not dropped when a
 * hand-off slot is free: from that skb on, every skb the server's socket
 * S receives is redirected (BPF_F_INGRESS) into the receive queue of the
 * slot's socket P, one end of a loopback TCP pair (P, Q) the agent's
 * proxy holds. The proxy reads P, frames and judges the requests with
 * internal/l7, and writes:
 *
 *   - the bytes it allows to P: l7_proxy_msg (sk_msg on weir_l7_proxy)
 *     redirects them with BPF_F_INGRESS into S's receive queue, where the
 *     server reads them as the client's;
 *   - its answers (403, 400) to Q: l7_proxy_msg sends them on S's egress,
 *     to the client. The proxy writes one only if the server had written
 *     since the last request it let go arrived (the seq marks below);
 *     nothing here checks it again.
 *
 * HTTP/1 responses never pass the proxy. S stays the application's socket with
 * the client as its peer, so nothing about the connection changes but
 * who reads its requests first. A slot serves one connection; when S
 * closes, the slot is marked closed and the proxy, once it has read all
 * that was redirected to P, offers the slot again with a fresh pair. A
 * slot popped while not free (offered twice) is never taken.
 *
 * HTTP/2 over cleartext (h2c: a connection that opens with the HTTP/2
 * preface, as gRPC's do) cannot be judged in the kernel (HPACK) nor
 * answered in the server's place without the server's frames (an answer
 * must fall between two of them). Such a connection is handed whole at
 * its first skb (l7_hand_off_h2c), or at the server's first bytes when
 * the server speaks first (l7_server_first: an HTTP/2 server's SETTINGS
 * may precede the client's preface): its record says h2, and l7_server_msg
 * then redirects what the server sends (BPF_F_INGRESS) into Q's receive
 * queue. The proxy ends HTTP/2 on both sides: it reads the client's
 * frames from P and writes its own to Q (out to the client), reads the
 * server's frames from Q and writes its own to P (into S, to the
 * server). Each request is judged whole, and a denied one answered 403 on
 * its own stream while the connection goes on.
 *
 *   weir_l7_proxy        sockhash: key slot*2 is P, slot*2+1 is Q
 *   weir_l7_proxy_ports  P's local port -> its slot: what P writes has it as
 *                        the local port, what Q writes as the remote one
 *                        (Q's own local port is the proxy listener's, shared)
 *   weir_l7_handoff      array by slot: the connection a slot serves
 *   weir_l7_free         queue of the free slots, filled by the proxy
 *   weir_l7_proxy_read   array by slot: bytes the proxy has read (the bound)
 *
 * All pinned: sockets keep the programs (and so the maps) they joined
 * with, and a restarted agent must find the same ones.
 */
#ifndef WEIR_LIB_L7PROXY_H
#define WEIR_LIB_L7PROXY_H

#include "common.h"
#include "l7flow.h"
#include "l7reset.h"
#include "l7sock.h"

#define L7_PROXY_SLOTS 1024

/* A slot's state (l7_handoff.state). */
#define L7_SLOT_FREE 0
#define L7_SLOT_ACTIVE 1 /* serving the connection in key */
#define L7_SLOT_CLOSED 2 /* its connection closed: recycle once drained */

/* Seq marks: for the last L7_SEQ_MARKS skbs redirected, where each began
 * in the handed stream and how far the server had written when it came.
 * The proxy answers a denied request in the server's place only if the
 * server has written since the last request it let go arrived (the test
 * the kernel makes, l7_answer_safe): otherwise the server's answer to
 * that request is still to come and ours would overtake it. */
#define L7_SEQ_MARKS 8

struct l7_seq_mark {
	__u64 offset; /* stream offset (of what P receives) where the skb began */
	__u32 seq;    /* the server's write_seq when it arrived */
	__u32 valid;
};

/* l7_handoff is what the proxy needs of the connection a slot serves.
 * The first skb redirected to P starts at stream offset 0 of what the
 * proxy reads; its first prefix bytes were allowed by the kernel and are
 * forwarded unjudged, and a request head begins after them. */
struct l7_handoff {
	__u64 cookie;             /* S's socket cookie */
	struct l7_sock_key key;   /* S in weir_l7_http */
	__u32 sets[L7_FLOW_SETS]; /* the sets when handed */
	__u32 prefix;             /* bytes forwarded unjudged */
	__u32 seq_owed;           /* S's write_seq when the kernel last let a request go */
	__u64 redirected;         /* bytes redirected to P */
	__u8 state;
	__u8 owes;                /* seq_owed is valid: a request went and the server had not answered at the hand-off */
	__u8 h2;                  /* HTTP/2 (h2c): the proxy speaks for both ends (below) */
	__u8 egress;              /* a client's connection, judged by its egress policy (below) */
	__u32 marks_next;         /* the next mark to write, mod L7_SEQ_MARKS */
	struct l7_seq_mark marks[L7_SEQ_MARKS];
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 2 * L7_PROXY_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_proxy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2 * L7_PROXY_SLOTS);
	__type(key, __u32); /* P's local port, host order */
	__type(value, __u32); /* slot */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_proxy_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, L7_PROXY_SLOTS);
	__type(key, __u32);
	__type(value, struct l7_handoff);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_handoff SEC(".maps");

/* How many bytes of its connection's stream each slot's proxy has read,
 * written by the proxy alone (the kernel writes weir_l7_handoff): the
 * verdict closes a handed connection whose redirected bytes run more
 * than L7_PROXY_BACKLOG ahead of it. S's TCP takes each skb it redirects,
 * so its receive window stays open whatever the proxy keeps up with:
 * this is the bound. */
#define L7_PROXY_BACKLOG (4U << 20)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, L7_PROXY_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_proxy_read SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_QUEUE);
	__uint(max_entries, L7_PROXY_SLOTS);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_free SEC(".maps");

/* l7_slot_serving returns the slot a connection's reader state names
 * (conn_slot is slot+1, 0 for none) if it still serves that socket
 * (cookie), else NULL: a slot is offered again only with a new record. */
__always_inline_fn struct l7_handoff *l7_slot_serving(__u32 conn_slot, __u64 cookie)
{
	__u32 slot = conn_slot - 1;
	struct l7_handoff *h;

	if (!conn_slot)
		return NULL;
	h = bpf_map_lookup_elem(&weir_l7_handoff, &slot);
	return h && h->cookie == cookie ? h : NULL;
}

/* l7_slot_take pops a free slot for the connection of socket cookie,
 * named key, restricted to sets, and makes its record anew (the caller
 * fills the rest and marks it active last). NULL when none is free, or
 * when the one popped was offered twice (its pair replaced while it was
 * queued): it is serving, or has served, another connection, so it is
 * not taken, and the caller closes this one rather than share a stream. */
__always_inline_fn struct l7_handoff *l7_slot_take(__u64 cookie, const struct l7_sock_key *key, const __u32 *sets,
						   __u32 *slot)
{
	struct l7_handoff *h;

	if (bpf_map_pop_elem(&weir_l7_free, slot))
		return NULL;
	h = bpf_map_lookup_elem(&weir_l7_handoff, slot);
	if (!h || h->state != L7_SLOT_FREE)
		return NULL;
	__builtin_memset(h, 0, sizeof(*h));
	h->cookie = cookie;
	h->key = *key;
	h->sets[0] = sets[0];
	h->sets[1] = sets[1];
	h->sets[2] = sets[2];
	return h;
}

/* l7_slot_serve fills in what the proxy needs of the connection a slot
 * just taken serves, and marks the slot active: its first prefix bytes
 * were allowed by the kernel; owes and seq_owed as struct l7_handoff's. */
__always_inline_fn void l7_slot_serve(struct l7_handoff *h, __u32 prefix, __u8 owes, __u32 seq_owed, __u8 h2,
				      __u8 egress)
{
	h->prefix = prefix;
	h->owes = owes;
	h->seq_owed = seq_owed;
	h->h2 = h2;
	h->egress = egress;
	h->state = L7_SLOT_ACTIVE;
}

/* l7_proxy_room says whether len more bytes may go to slot's proxy:
 * what was redirected and not yet read stays within L7_PROXY_BACKLOG. */
__always_inline_fn int l7_proxy_room(__u32 slot, struct l7_handoff *h, __u32 len)
{
	__u64 *read = bpf_map_lookup_elem(&weir_l7_proxy_read, &slot);

	if (read && h->redirected + len - *read <= L7_PROXY_BACKLOG)
		return 1;
	l7_count(L7_STAT_PROXY_BEHIND, 1);
	return 0;
}

/* l7_proxy_mark notes where the next bytes redirected begin in the
 * handed stream and how far the answering side stood (have: seq read). */
__always_inline_fn void l7_proxy_mark(struct l7_handoff *h, int have, __u32 seq)
{
	__u32 i = h->marks_next % L7_SEQ_MARKS;

	h->marks[i].offset = h->redirected;
	h->marks[i].seq = seq;
	h->marks[i].valid = have;
	h->marks_next++;
}

/* l7_to_proxy redirects an skb of a handed connection to its slot's P,
 * marking where it begins and how far the server had written. */
__always_inline_fn int l7_to_proxy(struct __sk_buff *skb, __u32 conn_slot, struct l7_handoff *h)
{
	__u32 slot = conn_slot - 1;
	__u32 p = slot * 2;
	__u32 seq = 0;
	int r;

	if (h->state != L7_SLOT_ACTIVE || !l7_proxy_room(slot, h, skb->len))
		return SK_DROP;
	l7_proxy_mark(h, l7_write_seq(skb, &seq) == 0, seq);
	r = bpf_sk_redirect_hash(skb, &weir_l7_proxy, &p, BPF_F_INGRESS);
	if (r == SK_PASS)
		h->redirected += skb->len;
	return r;
}

/*
 * A client's connection (egress policy, lib/l7client.h) is handed the
 * same way from the message its verdict cannot judge: that message and
 * every later one the application sends go (BPF_F_INGRESS) into P's
 * receive queue instead of the socket's send queue, and the proxy
 * writes
 *
 *   - the bytes it allows to P: l7_proxy_msg sends them on the client's
 *     socket C, moving the flow's judged mark past them first (tc lets
 *     only bytes below it out: nothing else ever enters C's send queue
 *     once it is handed, so the mark stays TCP's write sequence);
 *   - its answers to Q: into C's receive queue, read as the server's.
 *
 * The marks hold how far C had received when each message came (the
 * server's answers arriving, the same test of whether an answer of ours
 * would overtake the server's). Answers from the server are not read.
 */

/* l7_msg_to_proxy redirects a handed client's message to its slot's P,
 * marking where it begins and how far the client had received. */
__always_inline_fn int l7_msg_to_proxy(struct sk_msg_md *msg, __u32 conn_slot, struct l7_handoff *h)
{
	__u32 slot = conn_slot - 1;
	__u32 p = slot * 2;
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(msg->sk);
	int r;

	if (h->state != L7_SLOT_ACTIVE || !l7_proxy_room(slot, h, msg->size))
		return SK_DROP;
	l7_proxy_mark(h, tp != NULL, tp ? tp->rcv_nxt : 0);
	r = bpf_msg_redirect_hash(msg, &weir_l7_proxy, &p, BPF_F_INGRESS);
	if (r == SK_PASS)
		h->redirected += msg->size;
	return r;
}

#endif /* WEIR_LIB_L7PROXY_H */

/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * l7sock.h: the sockets whose inbound bytes L7 policy reads.
 *
 * An accepted TCP socket on an L7-enforced port joins one of two socket
 * hashes when its handshake completes (l7_sockops), and from then on its
 * inbound stream goes through the programs attached to that hash instead
 * of straight to the application:
 *
 *   weir_l7_strp  stream_parser + stream_verdict: the kernel's strparser
 *                 assembles a message of the length the parser names, the
 *                 verdict sees it whole (a request head, later)
 *   weir_l7_skb   skb_verdict alone: the verdict sees each skb as TCP
 *                 delivers it, without strparser's clone and work queue
 *   weir_l7_http  skb_verdict reading requests (lib/http.h) and judging
 *                 them (lib/l7match.h), the reader's state per socket in
 *                 weir_l7_conns
 *
 * A socket stays in its hash for its whole life: leaving it drops what its
 * queues hold (sk_psock_drop). Which hash a port uses is the value of
 * weir_l7_ports, the port in host order as the key.
 */
#ifndef WEIR_LIB_L7SOCK_H
#define WEIR_LIB_L7SOCK_H

#include "common.h"
#include "l7flow.h"

/* How a port's sockets are read (weir_l7_ports values' mode). */
#define WEIR_L7_STRPARSER 1   /* strparser, verdict passes everything (bench l7-gate) */
#define WEIR_L7_SKB_VERDICT 2 /* skb verdict passing everything (bench l7-gate) */
#define WEIR_L7_HTTP 3        /* skb verdict reading HTTP and judging it (l7.c) */

/* l7_port is how a port's sockets are read, and for WEIR_L7_HTTP the
 * HTTP set (lib/l7match.h) their requests are judged against. */
struct l7_port {
	__u8 mode;
	__u8 pad[3];
	__u32 set;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u16);
	__type(value, struct l7_port);
} weir_l7_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct l7_sock_key);
	__type(value, __u64);
} weir_l7_strp SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct l7_sock_key);
	__type(value, __u64);
} weir_l7_skb SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct l7_sock_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_http SEC(".maps");

/* Counters of the L7 socket path (weir_l7_stats indexes). */
enum {
	L7_STAT_SOCKETS,    /* sockets that joined a hash */
	L7_STAT_JOIN_FAIL,  /* sockets a hash refused (full) */
	L7_STAT_MESSAGES,   /* messages (or skbs) judged */
	L7_STAT_BYTES,      /* bytes judged */
	L7_STAT_ALLOWED,    /* requests allowed */
	L7_STAT_DENIED,     /* requests denied (403) */
	L7_STAT_REFUSED,    /* streams refused (400) */
	L7_STAT_PUNTED,     /* heads the kernel cannot judge */
	L7_STAT_SPLIT,      /* heads that did not end in the skb they began in */
	L7_STAT_ANSWERED,   /* answers written back in place */
	L7_STAT_CLOSED,     /* connections whose later bytes are all dropped */
	L7_STAT_NO_STATE,   /* skbs of a socket with no reader state: dropped */
	L7_STAT_EVENTS_LOST, /* request records a full ring lost (l7events.h) */
	L7_STAT_PIPELINED,  /* denials not answered: an earlier answer was still to come */
	L7_STAT_RESET,      /* closed connections reset (l7reset.h) */
	L7_STAT_RESET_UNLISTED, /* closed connections a full weir_l7_closing left unlisted */
	L7_STAT_HANDED,     /* connections handed to user space (l7proxy.h) */
	L7_STAT_PROXY_FORWARDED, /* bytes the proxy wrote back into servers' sockets */
	L7_STAT_PROXY_ANSWERED,  /* answers the proxy sent in servers' place */
	L7_STAT_PROXY_BEHIND,    /* handed connections closed: the proxy fell L7_PROXY_BACKLOG behind */
	L7_STAT_CLIENTS,    /* client sockets that joined weir_l7_client (l7client.h) */
	L7_STAT_CORKED,     /* messages held for the rest of a head they end in the middle of */
	L7_STAT_SEND_DESYNC, /* client connections closed: TCP took other bytes than the verdict judged */
	L7_STAT_REPLIES,    /* answers to allowed requests read (l7reply.h) */
	L7_STAT_REPLIES_LOST, /* connections whose answers are no longer read */
	L7_STAT_H2C,        /* HTTP/2 (h2c) connections handed whole to user space */
	L7_STAT_H2C_SERVER_BYTES, /* bytes h2c servers sent, steered into the proxy */
	L7_STAT_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, L7_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_stats SEC(".maps");

__always_inline_fn void l7_count(__u32 stat, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&weir_l7_stats, &stat);

	if (v)
		*v += n;
}

#endif /* WEIR_LIB_L7SOCK_H */

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * sock_iter.c: closing the sockets a removed Service backend leaves behind.
 *
 * sock.c translates a socket once, at connect(). A connected socket whose
 * backend is then removed would go on sending to an address that no longer
 * serves the Service: TCP until its retransmissions give up, connected UDP
 * for ever (the stale-conntrack bug kube-proxy flushes conntrack for). When
 * the agent takes backends from a Service it lists each (frontend, backend)
 * pair in weir_lb4_gone and reads these iterators in every namespace whose
 * sockets it translates; each socket that sock.c sent through a listed
 * frontend to its listed backend (by the socket's weir_lb4_revnat entry) is
 * closed with bpf_sock_destroy(): the application sees ECONNABORTED at
 * once, TCP also sends its peer a reset, and the next connect() picks a
 * backend that serves. A socket that named the pod address itself, or
 * reached the same backend through another Service that keeps it, stays.
 *
 *   iter/tcp    TCP sockets of the reading namespace
 *   iter/udp    UDP sockets of the reading namespace
 */
#include "lib/common.h"
#include "lib/iter.h"
#include "lib/lb.h"
#include "lib/metrics.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* weir_lb4_gone: hash, key struct lb4_member_key {frontend, backend}, the
 * pairs a sweep closes; filled and emptied by the agent around one sweep.
 * Not pinned: it lives as long as the agent's handle. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct lb4_member_key);
	__type(value, __u8);
} weir_lb4_gone SEC(".maps");

/* sock_went_to_gone reports whether sock.c sent sk, connected over proto,
 * through a frontend to a backend the frontend no longer has. */
__always_inline_fn int sock_went_to_gone(struct sock_common *sk, __u8 proto)
{
	struct lb4_member_key gone = {};
	struct lb4_revnat_key rkey = {};
	const struct lb4_revnat *rval;

	if (sk->skc_family != WEIR_AF_INET && sk->skc_family != WEIR_AF_INET6)
		return 0;
	/* An AF_INET6 socket connected to an IPv4-mapped address keeps the
	 * IPv4 address in skc_daddr too. */
	rkey.addr = sk->skc_daddr;
	rkey.port = sk->skc_dport;
	if (!rkey.addr)
		return 0; /* not connected */
	rkey.cookie = bpf_get_socket_cookie(sk);
	rval = bpf_map_lookup_elem(&weir_lb4_revnat, &rkey);
	if (!rval)
		return 0; /* not translated by sock.c */
	/* A NodePort reached at a node's address was translated by its
	 * any-node entry (vip 0), which is the frontend the agent names. */
	gone.svc.vip = (rval->flags & LB_REVNAT_ANY_NODE) ? 0 : rval->vip;
	gone.svc.port = rval->port;
	gone.svc.proto = proto;
	gone.backend.addr = rkey.addr;
	gone.backend.port = rkey.port;
	return bpf_map_lookup_elem(&weir_lb4_gone, &gone) != NULL;
}

__always_inline_fn void sock_close(struct sock_common *sk)
{
	if (bpf_sock_destroy(sk) == 0)
		metric_inc(METRIC_SOCK_LB_CLOSED);
}

SEC("iter/tcp")
int sock_destroy_tcp(struct bpf_iter__tcp *ctx)
{
	struct sock_common *sk = ctx->sk_common;

	if (!sk || !iter_tcp_connected(sk))
		return 0;
	if (sock_went_to_gone(sk, IPPROTO_TCP))
		sock_close(sk);
	return 0;
}

SEC("iter/udp")
int sock_destroy_udp(struct bpf_iter__udp *ctx)
{
	struct sock_common *sk = (struct sock_common *)ctx->udp_sk;

	if (!sk)
		return 0;
	if (sock_went_to_gone(sk, IPPROTO_UDP))
		sock_close(sk);
	return 0;
}

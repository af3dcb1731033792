// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * sock.c: Service translation at the socket, attached to the cgroup v2 root.
 *
 * A pod that connects to (or sends a datagram to) a ClusterIP port has the
 * destination replaced by one of the Service's backends before the kernel
 * builds a single packet. Every packet of the flow then carries the pod
 * address it really goes to, so from_container judges egress policy
 * against the backend's identity rather than the ClusterIP, and no
 * per-packet NAT or NAT conntrack is needed.
 *
 *   connect4     TCP and connected UDP: pick a backend, remember it
 *   sendmsg4     unconnected UDP: the same, per datagram
 *   recvmsg4     unconnected UDP replies: show the ClusterIP as the source
 *   getpeername4 show the ClusterIP as the peer
 *   connect6, sendmsg6, recvmsg6, getpeername6
 *                the same for AF_INET6 sockets naming a ClusterIP as an
 *                IPv4-mapped address (::ffff:10.96.0.10), as the JVM does
 *   sockops      a translated TCP socket sending its SYN: note its flow's
 *                frontend for flow records (lbflow.h); UDP is noted as it
 *                is translated
 *   sock_release a connected socket closing: forget its notes
 *
 * The programs run for every socket on the machine and act only in the
 * network namespaces of weir_sock_netns: this node's pods and, when no
 * kube-proxy runs beside Weir, the node's own. A Service whose clients
 * need affinity keeps each client (netns) on its backend (lb.h). A Service
 * the agent wrote without backends refuses the socket at once with
 * ECONNREFUSED, as kube-proxy's REJECT would (a TCP reset, an ICMP port
 * unreachable), instead of letting it time out. Beside kube-proxy the agent
 * writes no such Service, and an address Weir cannot translate (a slot
 * mid-update) is left alone for kube-proxy.
 */
#include <linux/errno.h>

#include "lib/common.h"
#include "lib/lb.h"
#define WEIR_LBFLOW_SOCKETS
#include "lib/lbflow.h"
#include "lib/metrics.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#define SOCK_PROCEED 1
#define SOCK_REJECT 0

/* sock_port reads the port the application named, in network order. */
__always_inline_fn __be16 sock_port(const struct bpf_sock_addr *ctx)
{
	volatile __u32 port = ctx->user_port;

	return (__be16)port;
}

/* sock6_mapped_v4 reads the IPv4 address an AF_INET6 socket names as
 * ::ffff:a.b.c.d (the JVM's and many dual-stack programs' way to reach
 * IPv4). It returns 0 for any other IPv6 address. */
__always_inline_fn int sock6_mapped_v4(const struct bpf_sock_addr *ctx, __be32 *v4)
{
	if (ctx->user_ip6[0] != 0 || ctx->user_ip6[1] != 0 ||
	    ctx->user_ip6[2] != bpf_htonl(0x0000ffff))
		return 0;
	*v4 = ctx->user_ip6[3];
	return 1;
}

enum sock_lb_result {
	SOCK_LB_UNTOUCHED,  /* no Service, not translated here, or a slot mid-rewrite */
	SOCK_LB_TRANSLATED, /* *to is the backend */
	SOCK_LB_REFUSED,    /* a Service without backends: the error is set */
};

/* sock_v4 is a socket address as IPv4: v4 for an AF_INET socket, the
 * last word of an AF_INET6 socket's IPv4-mapped address (w0..w3), 0 for
 * any other. */
__always_inline_fn __be32 sock_v4(__u32 family, __be32 v4, __be32 w0, __be32 w1, __be32 w2, __be32 w3)
{
	if (family == WEIR_AF_INET)
		return v4;
	if (family != WEIR_AF_INET6 || w0 != 0 || w1 != 0 || w2 != bpf_htonl(0x0000ffff))
		return 0;
	return w3;
}

/* sock_src_v4 reads the IPv4 address a socket is bound to, 0 when it is
 * bound to none (or is an AF_INET6 socket bound to no mapped address). */
__always_inline_fn __be32 sock_src_v4(const struct bpf_sock *sk)
{
	return sock_v4(ctx_load(sk->family), ctx_load(sk->src_ip4), ctx_load(sk->src_ip6[0]),
		       ctx_load(sk->src_ip6[1]), ctx_load(sk->src_ip6[2]), ctx_load(sk->src_ip6[3]));
}

/* sock_dst_v4 is sock_src_v4 for the address a socket is connected to. */
__always_inline_fn __be32 sock_dst_v4(const struct bpf_sock *sk)
{
	return sock_v4(ctx_load(sk->family), ctx_load(sk->dst_ip4), ctx_load(sk->dst_ip6[0]),
		       ctx_load(sk->dst_ip6[1]), ctx_load(sk->dst_ip6[2]), ctx_load(sk->dst_ip6[3]));
}

/* sock_note_udp notes a UDP socket's flow for flow records (lbflow.h).
 * The kernel gives a socket its port before sendmsg programs run, but
 * after connect ones: a connect() of an unbound socket is noted without
 * its port. */
__always_inline_fn void sock_note_udp(struct bpf_sock_addr *ctx, __u32 client, const struct lb4_backend *be,
				      __be32 vip, __be16 vport)
{
	struct bpf_sock *sk = ctx->sk;

	if (!sk)
		return;
	lb4_flow_note(sk, client, sock_src_v4(sk), bpf_htons(sk->src_port), be->addr, be->port, IPPROTO_UDP, vip,
		      vport);
}

/* sock_lb picks the backend a socket naming the IPv4 Service address vip
 * and the port the application named goes to, and remembers it for
 * replies and getpeername. */
__always_inline_fn enum sock_lb_result sock_lb(struct bpf_sock_addr *ctx, __be32 vip,
					       struct lb4_backend *to)
{
	struct lb4_key key = {};
	struct lb4_revnat_key rkey = {};
	struct lb4_revnat rval = {};
	const struct lb4_service *svc;
	const struct lb4_backend *be;
	const __u32 *netns;
	__u64 client;
	int affine;

	if (ctx->protocol != IPPROTO_TCP && ctx->protocol != IPPROTO_UDP)
		return SOCK_LB_UNTOUCHED;
	key.vip = vip;
	key.port = sock_port(ctx);
	key.proto = ctx->protocol;
	/* The map lookup is cheaper than the netns one: most connects on a
	 * node are not to a Service at all. */
	svc = bpf_map_lookup_elem(&weir_lb4_services, &key);
	if (!svc) {
		/* A NodePort at any node's address (lb.h). */
		key.vip = 0;
		svc = bpf_map_lookup_elem(&weir_lb4_services, &key);
		if (!svc || !bpf_map_lookup_elem(&weir_lb4_node_addrs, &vip))
			return SOCK_LB_UNTOUCHED;
		rval.flags = LB_REVNAT_ANY_NODE;
	}
	client = bpf_get_netns_cookie(ctx);
	netns = bpf_map_lookup_elem(&weir_sock_netns, &client);
	if (!netns)
		return SOCK_LB_UNTOUCHED;
	/* NodePorts at 127.0.0.1 serve the node's own processes (value 0);
	 * a pod's loopback is its own. */
	if ((bpf_ntohl(vip) >> 24) == 127 && *netns != 0)
		return SOCK_LB_UNTOUCHED;
	if (svc->count == 0) {
		metric_inc(METRIC_SOCK_LB_REJECT);
		bpf_set_retval(-ECONNREFUSED);
		return SOCK_LB_REFUSED;
	}
	be = lb4_pick(&key, svc, client, &affine);
	if (!be) {
		metric_inc(METRIC_SOCK_LB_MISS);
		return SOCK_LB_UNTOUCHED;
	}
	*to = *be;
	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = be->addr;
	rkey.port = be->port;
	rval.vip = vip;
	rval.port = key.port;
	bpf_map_update_elem(&weir_lb4_revnat, &rkey, &rval, BPF_ANY);
	/* TCP is noted when it has its port (sock_tcp_connecting). */
	if (key.proto == IPPROTO_UDP)
		sock_note_udp(ctx, *netns, be, vip, key.port);
	metric_inc(affine ? METRIC_SOCK_LB_AFFINITY : METRIC_SOCK_LB);
	return SOCK_LB_TRANSLATED;
}

/* sock_revnat finds the Service address a socket's peer addr:port stands
 * for, if the socket was translated to it. */
__always_inline_fn const struct lb4_revnat *sock_revnat(struct bpf_sock_addr *ctx, __be32 addr)
{
	struct lb4_revnat_key rkey = {};

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = addr;
	rkey.port = sock_port(ctx);
	return bpf_map_lookup_elem(&weir_lb4_revnat, &rkey);
}

/* sock4_translate points an AF_INET socket that names a Service at one of
 * its backends; SOCK_REJECT, with the caller's error set, for a Service
 * that has none. */
__always_inline_fn int sock4_translate(struct bpf_sock_addr *ctx)
{
	struct lb4_backend be;

	switch (sock_lb(ctx, ctx->user_ip4, &be)) {
	case SOCK_LB_REFUSED:
		return SOCK_REJECT;
	case SOCK_LB_TRANSLATED:
		ctx->user_ip4 = be.addr;
		ctx->user_port = be.port;
		break;
	default:
		break;
	}
	return SOCK_PROCEED;
}

/* sock6_translate is sock4_translate for an AF_INET6 socket naming an
 * IPv4-mapped address: the backend is written back mapped. */
__always_inline_fn int sock6_translate(struct bpf_sock_addr *ctx)
{
	struct lb4_backend be;
	__be32 vip;

	if (!sock6_mapped_v4(ctx, &vip))
		return SOCK_PROCEED;
	switch (sock_lb(ctx, vip, &be)) {
	case SOCK_LB_REFUSED:
		return SOCK_REJECT;
	case SOCK_LB_TRANSLATED:
		ctx->user_ip6[3] = be.addr;
		ctx->user_port = be.port;
		break;
	default:
		break;
	}
	return SOCK_PROCEED;
}

__always_inline_fn void sock4_reverse(struct bpf_sock_addr *ctx)
{
	const struct lb4_revnat *rval = sock_revnat(ctx, ctx->user_ip4);

	if (!rval)
		return;
	ctx->user_ip4 = rval->vip;
	ctx->user_port = rval->port;
}

__always_inline_fn void sock6_reverse(struct bpf_sock_addr *ctx)
{
	const struct lb4_revnat *rval;
	__be32 addr;

	if (!sock6_mapped_v4(ctx, &addr))
		return;
	rval = sock_revnat(ctx, addr);
	if (!rval)
		return;
	ctx->user_ip6[3] = rval->vip;
	ctx->user_port = rval->port;
}

SEC("cgroup/connect4")
int sock4_connect(struct bpf_sock_addr *ctx)
{
	return sock4_translate(ctx);
}

SEC("cgroup/sendmsg4")
int sock4_sendmsg(struct bpf_sock_addr *ctx)
{
	return sock4_translate(ctx);
}

SEC("cgroup/recvmsg4")
int sock4_recvmsg(struct bpf_sock_addr *ctx)
{
	sock4_reverse(ctx);
	return SOCK_PROCEED;
}

SEC("cgroup/getpeername4")
int sock4_getpeername(struct bpf_sock_addr *ctx)
{
	sock4_reverse(ctx);
	return SOCK_PROCEED;
}

SEC("cgroup/connect6")
int sock6_connect(struct bpf_sock_addr *ctx)
{
	return sock6_translate(ctx);
}

SEC("cgroup/sendmsg6")
int sock6_sendmsg(struct bpf_sock_addr *ctx)
{
	return sock6_translate(ctx);
}

SEC("cgroup/recvmsg6")
int sock6_recvmsg(struct bpf_sock_addr *ctx)
{
	sock6_reverse(ctx);
	return SOCK_PROCEED;
}

SEC("cgroup/getpeername6")
int sock6_getpeername(struct bpf_sock_addr *ctx)
{
	sock6_reverse(ctx);
	return SOCK_PROCEED;
}

/* sock_ops_v4 reads a TCP socket's IPv4 ends, also those of an AF_INET6
 * socket connected to an IPv4-mapped address; 0 for any other socket. */
__always_inline_fn int sock_ops_v4(const struct bpf_sock_ops *ctx, __be32 *local, __be32 *remote)
{
	__u32 family = ctx_load(ctx->family);
	__be32 l4 = ctx_load(ctx->local_ip4), l6 = ctx_load(ctx->local_ip6[3]);

	*remote = sock_v4(family, ctx_load(ctx->remote_ip4), ctx_load(ctx->remote_ip6[0]), ctx_load(ctx->remote_ip6[1]),
			  ctx_load(ctx->remote_ip6[2]), ctx_load(ctx->remote_ip6[3]));
	*local = family == WEIR_AF_INET ? l4 : l6;
	return *remote != 0;
}

/* A TCP socket sock_lb translated is about to send its SYN: its source
 * port is chosen now, so its flow can be noted (lbflow.h) before the
 * first packet reaches from_container. */
__always_inline_fn void sock_tcp_connecting(struct bpf_sock_ops *ctx)
{
	struct lb4_revnat_key rkey = {};
	const struct lb4_revnat *rval;
	const __u32 *netns;
	__be32 local, remote;
	__u64 client;

	if (!sock_ops_v4(ctx, &local, &remote))
		return;
	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = remote;
	/* remote_port holds the port in network order in its upper half. */
	rkey.port = (__be16)(ctx->remote_port >> 16);
	rval = bpf_map_lookup_elem(&weir_lb4_revnat, &rkey);
	if (!rval)
		return; /* not translated: most connects */
	client = bpf_get_netns_cookie(ctx);
	netns = bpf_map_lookup_elem(&weir_sock_netns, &client);
	if (!netns)
		return;
	if (ctx->sk)
		lb4_flow_note(ctx->sk, *netns, local, bpf_htons((__u16)ctx->local_port), remote, rkey.port,
			      IPPROTO_TCP, rval->vip, rval->port);
}

SEC("sockops")
int sock_tcp_ops(struct bpf_sock_ops *ctx)
{
	if (ctx->op == BPF_SOCK_OPS_TCP_CONNECT_CB)
		sock_tcp_connecting(ctx);
	return 1;
}

/* A socket is released: its flow note goes with it (lbflow.h), and so
 * does the reverse translation of its peer, which only its own calls
 * could read. An unconnected UDP socket names no peer here; the reverse
 * translations of its datagrams age out of the LRU. */
SEC("cgroup/sock_release")
int sock_released(struct bpf_sock *sk)
{
	struct lb4_revnat_key rkey = {};

	if (sk->protocol != IPPROTO_TCP && sk->protocol != IPPROTO_UDP)
		return SOCK_PROCEED;
	lb4_flow_forget(sk);
	rkey.addr = sock_dst_v4(sk);
	rkey.port = (__be16)sk->dst_port;
	if (!rkey.addr || !rkey.port)
		return SOCK_PROCEED; /* not connected */
	rkey.cookie = bpf_get_socket_cookie(sk);
	bpf_map_delete_elem(&weir_lb4_revnat, &rkey);
	return SOCK_PROCEED;
}

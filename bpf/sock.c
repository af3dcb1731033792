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

/* sock4_translate points a socket that names a Service at one of its
 * backends. It returns SOCK_REJECT, with the error the caller sees set,
 * for a Service that has none. */
__always_inline_fn int sock4_translate(struct bpf_sock_addr *ctx)
{
	struct lb4_key key = {};
	struct lb4_revnat_key rkey = {};
	struct lb4_revnat rval = {};
	const struct lb4_service *svc;
	const struct lb4_backend *be;
	__u64 client;
	int affine;

	if (ctx->protocol != IPPROTO_TCP && ctx->protocol != IPPROTO_UDP)
		return SOCK_PROCEED;
	key.vip = ctx->user_ip4;
	key.port = sock_port(ctx);
	key.proto = ctx->protocol;
	/* The map lookup is cheaper than the netns one: most connects on a
	 * node are not to a Service at all. */
	svc = bpf_map_lookup_elem(&weir_lb4_services, &key);
	if (!svc)
		return SOCK_PROCEED;
	client = bpf_get_netns_cookie(ctx);
	if (!bpf_map_lookup_elem(&weir_sock_netns, &client))
		return SOCK_PROCEED;
	if (svc->count == 0) {
		metric_inc(METRIC_SOCK_LB_REJECT);
		bpf_set_retval(-ECONNREFUSED);
		return SOCK_REJECT;
	}
	be = lb4_pick(&key, svc, client, &affine);
	if (!be) {
		metric_inc(METRIC_SOCK_LB_MISS);
		return SOCK_PROCEED;
	}
	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = be->addr;
	rkey.port = be->port;
	rval.vip = key.vip;
	rval.port = key.port;
	bpf_map_update_elem(&weir_lb4_revnat, &rkey, &rval, BPF_ANY);

	ctx->user_ip4 = be->addr;
	ctx->user_port = be->port;
	metric_inc(affine ? METRIC_SOCK_LB_AFFINITY : METRIC_SOCK_LB);
	return SOCK_PROCEED;
}

__always_inline_fn void sock4_reverse(struct bpf_sock_addr *ctx)
{
	struct lb4_revnat_key rkey = {};
	const struct lb4_revnat *rval;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = ctx->user_ip4;
	rkey.port = sock_port(ctx);
	rval = bpf_map_lookup_elem(&weir_lb4_revnat, &rkey);
	if (!rval)
		return;
	ctx->user_ip4 = rval->vip;
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

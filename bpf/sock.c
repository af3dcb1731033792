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
 * network namespaces of this node's pods (weir_sock_netns); the node's own
 * processes keep going through kube-proxy. An address Weir cannot
 * translate (no ready backend, a slot mid-update) is left alone, so
 * kube-proxy answers it as it would without Weir.
 */
#include "lib/common.h"
#include "lib/lb.h"
#include "lib/metrics.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#define SOCK_PROCEED 1

__always_inline_fn int sock_in_pod(struct bpf_sock_addr *ctx)
{
	__u64 cookie = bpf_get_netns_cookie(ctx);

	return bpf_map_lookup_elem(&weir_sock_netns, &cookie) != NULL;
}

/* sock_port reads the port the application named, in network order. */
__always_inline_fn __be16 sock_port(const struct bpf_sock_addr *ctx)
{
	volatile __u32 port = ctx->user_port;

	return (__be16)port;
}

__always_inline_fn void sock4_translate(struct bpf_sock_addr *ctx)
{
	struct lb4_key key = {};
	struct lb4_revnat_key rkey = {};
	struct lb4_revnat rval = {};
	const struct lb4_backend *be;

	if (ctx->protocol != IPPROTO_TCP && ctx->protocol != IPPROTO_UDP)
		return;
	key.vip = ctx->user_ip4;
	key.port = sock_port(ctx);
	key.proto = ctx->protocol;
	/* The map lookup is cheaper than the netns one: most connects on a
	 * node are not to a Service at all. */
	if (!bpf_map_lookup_elem(&weir_lb4_services, &key) || !sock_in_pod(ctx))
		return;
	be = lb4_pick(&key);
	if (!be) {
		metric_inc(METRIC_SOCK_LB_MISS);
		return;
	}
	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = be->addr;
	rkey.port = be->port;
	rval.vip = key.vip;
	rval.port = key.port;
	bpf_map_update_elem(&weir_lb4_revnat, &rkey, &rval, BPF_ANY);

	ctx->user_ip4 = be->addr;
	ctx->user_port = be->port;
	metric_inc(METRIC_SOCK_LB);
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
	sock4_translate(ctx);
	return SOCK_PROCEED;
}

SEC("cgroup/sendmsg4")
int sock4_sendmsg(struct bpf_sock_addr *ctx)
{
	sock4_translate(ctx);
	return SOCK_PROCEED;
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

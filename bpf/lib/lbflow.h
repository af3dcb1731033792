/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * lbflow.h: which Service a flow went through, for its flow records.
 *
 * sock.c translates a socket before its first packet exists, so the
 * packets, and the verdicts the tc programs judge them by, carry the
 * backend only. So that a flow record can still say "through Service
 * default/web", the socket layer notes every translated flow here, under
 * the tuple its packets will carry, and policy_judge_end (conntrack.h)
 * copies the frontend into the verdict event it emits. Only events read
 * the map: no packet pays for it.
 *
 * weir_lb4_flows: LRU hash, key struct lb4_flow_key {client, backend
 * address and port, client port, protocol}, value struct lb4_flow
 * {frontend address and port, client address}. client is the host ifindex
 * weir_sock_netns gives the client's network namespace: a pod's, or 0 for
 * the node's own. A pod has one address and cannot send from another
 * (lxc.c), so its namespace stands for its address; the node has several,
 * so its entries carry the client address and match only that.
 *
 * An entry is written once the socket has its source port: TCP when it
 * sends its SYN (sockops TCP_CONNECT_CB), unconnected UDP per datagram
 * (sendmsg). A UDP socket connect()ed before it was bound gets its port
 * only after every cgroup hook of the connect has run, and no hook runs
 * before its first datagram: its entry has client port 0 and stands for
 * every UDP flow of that client to that backend port. So a pod that, at
 * the same time, sends to that backend port directly, from another
 * socket, sees that flow named with the Service too; such a record says
 * so (lb4_flow_frontend). The socket keeps the key of its latest entry in weir_lb4_flow_socks, and
 * that entry is deleted when the socket is released: a later socket
 * reusing the port to reach the backend directly is never taken for one
 * through the Service. An unconnected socket that sent to several
 * backends keeps only its latest; the others age out of the LRU.
 *
 * weir_lb4_flow_socks: socket storage, value struct lb4_flow_key: the
 * latest entry of a socket in weir_lb4_flows. The kernel frees it with
 * the socket.
 */
#ifndef WEIR_LIB_LBFLOW_H
#define WEIR_LIB_LBFLOW_H

#include "common.h"

struct lb4_flow_key {
	__u32 client; /* host ifindex of the client's namespace; 0: the node's */
	__be32 daddr; /* the backend */
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

struct lb4_flow {
	__be32 vip;   /* the frontend the application named */
	__be16 port;
	__u16 pad;
	__be32 saddr; /* the client's address; 0: the pod's own (client != 0) */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 131072);
	__type(key, struct lb4_flow_key);
	__type(value, struct lb4_flow);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_lb4_flows SEC(".maps");

#ifdef WEIR_LBFLOW_SOCKETS
/* Only the socket programs, which write the entries, have sockets. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct lb4_flow_key);
} weir_lb4_flow_socks SEC(".maps");

/* lb4_flow_note records that the flow of sk, client's socket, from
 * saddr:sport to the backend daddr:dport went through the frontend
 * vip:vport. */
__always_inline_fn void lb4_flow_note(void *sk, __u32 client, __be32 saddr, __be16 sport, __be32 daddr,
				      __be16 dport, __u8 proto, __be32 vip, __be16 vport)
{
	struct lb4_flow_key key = {
		.client = client, .daddr = daddr, .sport = sport, .dport = dport, .proto = proto,
	};
	struct lb4_flow val = { .vip = vip, .port = vport, .saddr = saddr };
	struct lb4_flow_key *latest;

	/* The node's sockets are told apart by their address alone. */
	if (client == 0 && saddr == 0)
		return;
	latest = bpf_sk_storage_get(&weir_lb4_flow_socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!latest)
		return; /* an entry the socket could not delete would outlive it */
	*latest = key;
	bpf_map_update_elem(&weir_lb4_flows, &key, &val, BPF_ANY);
}

/* lb4_flow_forget deletes the latest entry of sk, a socket being
 * released. */
__always_inline_fn void lb4_flow_forget(void *sk)
{
	struct lb4_flow_key *latest = bpf_sk_storage_get(&weir_lb4_flow_socks, sk, 0, 0);

	if (latest)
		bpf_map_delete_elem(&weir_lb4_flows, latest);
}
#endif

/* lb4_flow_frontend finds the frontend the flow saddr:sport -> daddr:dport
 * of client went through. It returns LB4_FLOW_NONE when the flow went to
 * daddr itself (or its node did not see it), LB4_FLOW_SOCKET when its
 * socket's entry names the frontend, LB4_FLOW_CLIENT when only its
 * client's portless entry of a connected UDP socket does. */
#define LB4_FLOW_NONE 0
#define LB4_FLOW_SOCKET 1
#define LB4_FLOW_CLIENT 2

__always_inline_fn int lb4_flow_frontend(__u32 client, __be32 saddr, __be16 sport, __be32 daddr, __be16 dport,
					 __u8 proto, __be32 *vip, __be16 *vport)
{
	struct lb4_flow_key key = {
		.client = client, .daddr = daddr, .sport = sport, .dport = dport, .proto = proto,
	};
	const struct lb4_flow *f;
	int found = LB4_FLOW_SOCKET;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return LB4_FLOW_NONE;
	f = bpf_map_lookup_elem(&weir_lb4_flows, &key);
	if (!f && proto == IPPROTO_UDP) {
		key.sport = 0;
		f = bpf_map_lookup_elem(&weir_lb4_flows, &key);
		found = LB4_FLOW_CLIENT;
	}
	if (!f || (f->saddr && f->saddr != saddr) || (client == 0 && f->saddr == 0))
		return LB4_FLOW_NONE;
	*vip = f->vip;
	*vport = f->port;
	return found;
}

#endif /* WEIR_LIB_LBFLOW_H */

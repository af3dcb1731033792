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
 * so (lb4_flow_frontend). Sockets of one pod sharing that entry count
 * on it (refs), and the last released deletes it; if they named
 * different frontends (two Services sharing the backend port) it names
 * none.
 *
 * A socket has one entry: a new note of it (an unconnected socket's
 * datagram to another backend, a reconnect) replaces its previous one,
 * and the entry is deleted when the socket is released, so a later
 * socket reusing the port to reach the backend directly is not taken for
 * one through the Service. An event of a flow whose note was replaced (a
 * policy re-check of an older datagram flow) names no Service.
 *
 * The node's own sockets are noted only with their address: a UDP socket
 * of the node bound to none is not noted.
 *
 * weir_lb4_flow_socks: socket storage, value struct lb4_flow_key: the
 * entry of a socket in weir_lb4_flows. The kernel frees it with the
 * socket; the map is pinned, so a restarted agent's programs still
 * delete the entries of sockets open across the restart.
 */
#ifndef WEIR_LIB_LBFLOW_H
#define WEIR_LIB_LBFLOW_H

#include "common.h"
#include "lbnat.h"

struct lb4_flow_key {
	__u32 client; /* host ifindex of the client's namespace; 0: the node's */
	__be32 daddr; /* the backend */
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

/* lb4_flow.flags */
#define LB4_FLOW_AMBIGUOUS 1 /* portless, shared by sockets of different frontends */

struct lb4_flow {
	__be32 vip;   /* the frontend the application named */
	__be16 port;
	__u8 flags;
	__u8 pad;
	__be32 saddr; /* the client's address; 0: the pod's own (client != 0) */
	__u32 refs;   /* portless entries: the sockets sharing it */
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
	/* Pinned: a restarted agent's programs must still find the notes
	 * of the sockets open across the restart, to delete them. */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_lb4_flow_socks SEC(".maps");

/* lb4_flow_share counts one more socket on a portless entry: sockets of
 * one client connected to one backend port share it. One that names
 * another frontend makes it ambiguous: it then names none. */
__always_inline_fn void lb4_flow_share(const struct lb4_flow_key *key, struct lb4_flow *val)
{
	struct lb4_flow *f = bpf_map_lookup_elem(&weir_lb4_flows, key);

	if (!f) {
		val->refs = 1;
		if (bpf_map_update_elem(&weir_lb4_flows, key, val, BPF_NOEXIST) == 0)
			return;
		f = bpf_map_lookup_elem(&weir_lb4_flows, key); /* another CPU's, just made */
		if (!f)
			return;
	}
	if (f->vip != val->vip || f->port != val->port)
		f->flags |= LB4_FLOW_AMBIGUOUS;
	__sync_fetch_and_add(&f->refs, 1);
}

/* lb4_flow_drop deletes a socket's entry, or for a portless one counts
 * one socket less and deletes it with the last. */
__always_inline_fn void lb4_flow_drop(const struct lb4_flow_key *key)
{
	struct lb4_flow *f;

	if (key->sport) {
		bpf_map_delete_elem(&weir_lb4_flows, key);
		return;
	}
	f = bpf_map_lookup_elem(&weir_lb4_flows, key);
	if (f && __sync_fetch_and_add(&f->refs, -1) <= 1)
		bpf_map_delete_elem(&weir_lb4_flows, key);
}

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
	if (latest->proto && __builtin_memcmp(latest, &key, sizeof(key)) == 0) {
		if (sport) /* a datagram of the socket's flow, or its reconnect */
			bpf_map_update_elem(&weir_lb4_flows, &key, &val, BPF_ANY);
		return;
	}
	/* One note per socket: its previous flow (another backend of an
	 * unconnected socket, a reconnect) was reported when it began. */
	if (latest->proto)
		lb4_flow_drop(latest);
	*latest = key;
	if (sport)
		bpf_map_update_elem(&weir_lb4_flows, &key, &val, BPF_ANY);
	else
		lb4_flow_share(&key, &val);
}

/* lb4_flow_forget drops the entry of sk, a socket being released. */
__always_inline_fn void lb4_flow_forget(void *sk)
{
	struct lb4_flow_key *latest = bpf_sk_storage_get(&weir_lb4_flow_socks, sk, 0, 0);

	if (latest && latest->proto)
		lb4_flow_drop(latest);
}
#endif

/* lb4_flow_frontend finds the frontend the flow saddr:sport -> daddr:dport
 * of client went through. It returns LB4_FLOW_NONE when the flow went to
 * daddr itself (or its node did not see it), LB4_FLOW_SOCKET when its
 * socket's entry names the frontend, LB4_FLOW_CLIENT when only its
 * client's portless entry of a connected UDP socket does, LB4_FLOW_NAT
 * when the flow came from outside the cluster and nodeport.h translated
 * it (its reply direction in weir_lb4_nat_rev names the frontend). */
#define LB4_FLOW_NONE 0
#define LB4_FLOW_SOCKET 1
#define LB4_FLOW_CLIENT 2
#define LB4_FLOW_NAT 3

/* lb4_flow_nat finds the frontend of a flow from outside that nodeport.h
 * translated to the backend daddr:dport. */
__always_inline_fn int lb4_flow_nat(__be32 saddr, __be16 sport, __be32 daddr, __be16 dport, __u8 proto,
				    __be32 *vip, __be16 *vport)
{
	struct lb4_tuple rev = { .saddr = daddr, .daddr = saddr, .sport = dport, .dport = sport, .proto = proto };
	const struct lb4_nat *front = bpf_map_lookup_elem(&weir_lb4_nat_rev, &rev);

	if (!front)
		return LB4_FLOW_NONE;
	*vip = front->addr;
	*vport = front->port;
	return LB4_FLOW_NAT;
}

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
	if (!f && client == 0 && SERVE_EXTERNAL_SERVICES &&
	    lb4_flow_nat(saddr, sport, daddr, dport, proto, vip, vport) == LB4_FLOW_NAT)
		return LB4_FLOW_NAT;
	if (!f && proto == IPPROTO_UDP) {
		key.sport = 0;
		f = bpf_map_lookup_elem(&weir_lb4_flows, &key);
		found = LB4_FLOW_CLIENT;
	}
	if (!f || (f->saddr && f->saddr != saddr) || (client == 0 && f->saddr == 0) ||
	    (f->flags & LB4_FLOW_AMBIGUOUS))
		return LB4_FLOW_NONE;
	*vip = f->vip;
	*vport = f->port;
	return found;
}

#endif /* WEIR_LIB_LBFLOW_H */

/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * lb.h: Service frontends and their backends, for socket-level translation.
 *
 * weir_lb4_services: hash, key struct lb4_key {vip, port, proto, scope},
 * value struct lb4_service {count, flags, affinity_s}. One entry per
 * Service address and port for sockets (scope LB_SCOPE_SOCKET), and, with
 * no kube-proxy beside Weir, one per NodePort, external IP and load
 * balancer IP for packets from outside (LB_SCOPE_EXTERNAL, nodeport.h). A
 * count of zero is a Service without backends that Weir answers itself:
 * new sockets to it are refused.
 *
 * weir_lb4_backends: hash, key struct lb4_backend_key {service, slot},
 * value struct lb4_backend {addr, port}. Slots 1..count of a service.
 *
 * The agent grows a service by writing the new slots before the count and
 * shrinks it by writing the count before deleting slots, so a reader that
 * sees a count always finds its slots; a slot that is missing anyway (a
 * torn read during a rewrite) leaves the address untranslated, and
 * kube-proxy, which still runs, serves that one connection.
 *
 * weir_lb4_revnat: LRU hash, key struct lb4_revnat_key {socket cookie,
 * backend}, value struct lb4_revnat {vip}. What a socket was translated to,
 * so replies to unconnected UDP and getpeername() show the Service address
 * the application asked for. A connected socket's entry is deleted when
 * the socket is released (sock.c); those of unconnected datagrams age out.
 *
 * weir_lb4_affinity: LRU hash, key struct lb4_affinity_key {service,
 * netns cookie}, value struct lb4_affinity {backend, last_ns}. The backend
 * each client of a sessionAffinity: ClientIP Service last went to. A pod is
 * one network namespace with one address, so its netns cookie stands for
 * its client IP; the node's own processes share theirs, as they share the
 * node's address.
 *
 * weir_lb4_members: hash, key struct lb4_member_key {service, backend},
 * value __u32 slot. The backends of every affinity Service, so a client's
 * remembered backend is checked to be one still in O(1). The agent deletes
 * a member before its slot and adds one before its slot.
 *
 * weir_lb4_node_addrs: hash, key __be32 (a node's address), value __u32
 * (reserved). Every node's address, where NodePorts are served: a
 * NodePort's socket entry has vip 0 (any node address), so a NodePort
 * costs one entry whatever the number of nodes; a socket naming an address
 * of this map and a port without an entry of its own finds the NodePort
 * there. (An externalTrafficPolicy: Local NodePort keeps an entry per node
 * address: another node's serves that node's endpoints alone.)
 *
 * weir_sock_netns: hash, key netns cookie, value host ifindex. The network
 * namespaces whose sockets are translated: this node's pods, and with no
 * kube-proxy beside Weir the node's own namespace (value 0), where its
 * processes and hostNetwork pods live. The cgroup programs run for every
 * socket on the machine and translate only in these.
 */
#ifndef WEIR_LIB_LB_H
#define WEIR_LIB_LB_H

#include "common.h"

/* lb4_key.scope: who a frontend entry serves. */
#define LB_SCOPE_SOCKET 0   /* sockets of this node (sock.c) */
#define LB_SCOPE_EXTERNAL 1 /* packets from outside the cluster (nodeport.h) */

struct lb4_key {
	__be32 vip;
	__be16 port;
	__u8 proto;
	__u8 scope;
};

/* lb4_service.flags */
#define LB_FLAG_DROP 1 /* no backend: drop rather than refuse (nodeport.h) */

struct lb4_service {
	__u16 count;
	__u8 flags;
	__u8 pad;
	__u32 affinity_s; /* sessionAffinity timeout in seconds; 0: none */
};

struct lb4_backend_key {
	struct lb4_key svc;
	__u32 slot;
};

struct lb4_backend {
	__be32 addr;
	__be16 port;
	__u16 pad;
};

struct lb4_revnat_key {
	__u64 cookie;
	__be32 addr;
	__be16 port;
	__u16 pad;
};

/* lb4_revnat.flags */
#define LB_REVNAT_ANY_NODE 1 /* translated by a NodePort's any-node entry */

struct lb4_revnat {
	__be32 vip; /* the address the application named */
	__be16 port;
	__u16 flags;
};

struct lb4_affinity_key {
	struct lb4_key svc;
	__u64 client; /* netns cookie */
};

struct lb4_affinity {
	struct lb4_backend backend;
	__u64 last_ns;
};

struct lb4_member_key {
	struct lb4_key svc;
	struct lb4_backend backend;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct lb4_key);
	__type(value, struct lb4_service);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_lb4_services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __be32);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_lb4_node_addrs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__type(key, struct lb4_backend_key);
	__type(value, struct lb4_backend);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_lb4_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 131072);
	__type(key, struct lb4_revnat_key);
	__type(value, struct lb4_revnat);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_lb4_revnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_sock_netns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 131072);
	__type(key, struct lb4_affinity_key);
	__type(value, struct lb4_affinity);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_lb4_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct lb4_member_key);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_lb4_members SEC(".maps");

/* lb4_pick_random returns a backend of svc, the service at key, or NULL
 * if it has none (or its slot is mid-rewrite). */
__always_inline_fn const struct lb4_backend *lb4_pick_random(const struct lb4_key *key,
							      const struct lb4_service *svc)
{
	struct lb4_backend_key bkey = { .svc = *key };

	if (svc->count == 0)
		return NULL;
	bkey.slot = 1 + bpf_get_prandom_u32() % svc->count;
	return bpf_map_lookup_elem(&weir_lb4_backends, &bkey);
}

/* lb4_remembered returns the backend client last used for the affinity
 * service at key, if that was within the service's timeout and the
 * backend still serves it. It counts as used again now. */
__always_inline_fn const struct lb4_backend *lb4_remembered(struct lb4_affinity_key *akey,
							     const struct lb4_service *svc, __u64 now)
{
	struct lb4_member_key mkey = { .svc = akey->svc };
	struct lb4_affinity *aff;

	aff = bpf_map_lookup_elem(&weir_lb4_affinity, akey);
	if (!aff || now - aff->last_ns > (__u64)svc->affinity_s * 1000000000ULL)
		return NULL;
	mkey.backend = aff->backend;
	if (!bpf_map_lookup_elem(&weir_lb4_members, &mkey))
		return NULL;
	aff->last_ns = now;
	return &aff->backend;
}

/* lb4_pick returns the backend a new socket of client (its netns cookie)
 * to the service at key goes to: the one it had while its affinity holds,
 * otherwise one at random. NULL if the service has none. *affine says the
 * backend was the client's already. */
__always_inline_fn const struct lb4_backend *lb4_pick(const struct lb4_key *key,
						      const struct lb4_service *svc,
						      __u64 client, int *affine)
{
	struct lb4_affinity_key akey = { .svc = *key, .client = client };
	struct lb4_affinity fresh = {};
	const struct lb4_backend *be;
	__u64 now;

	*affine = 0;
	if (svc->affinity_s == 0)
		return lb4_pick_random(key, svc);
	now = bpf_ktime_get_ns();
	be = lb4_remembered(&akey, svc, now);
	if (be) {
		*affine = 1;
		return be;
	}
	be = lb4_pick_random(key, svc);
	if (!be)
		return NULL;
	fresh.backend = *be;
	fresh.last_ns = now;
	bpf_map_update_elem(&weir_lb4_affinity, &akey, &fresh, BPF_ANY);
	return be;
}

#endif /* WEIR_LIB_LB_H */

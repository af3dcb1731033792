/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * lb.h: Service frontends and their backends, for socket-level translation.
 *
 * weir_lb4_services: hash, key struct lb4_key {vip, port, proto}, value
 * struct lb4_service {count}. One entry per ClusterIP port.
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
 * the application asked for.
 *
 * weir_sock_netns: hash, key netns cookie, value host ifindex. The network
 * namespaces of this node's pods: the cgroup programs run for every socket
 * on the machine and translate only in these.
 */
#ifndef WEIR_LIB_LB_H
#define WEIR_LIB_LB_H

#include "common.h"

struct lb4_key {
	__be32 vip;
	__be16 port;
	__u8 proto;
	__u8 pad;
};

struct lb4_service {
	__u32 count;
	__u32 flags; /* reserved */
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

struct lb4_revnat {
	__be32 vip;
	__be16 port;
	__u16 pad;
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

/* lb4_pick returns a backend of the service at key, or NULL if it has none. */
__always_inline_fn const struct lb4_backend *lb4_pick(const struct lb4_key *key)
{
	struct lb4_backend_key bkey = { .svc = *key };
	const struct lb4_service *svc;

	svc = bpf_map_lookup_elem(&weir_lb4_services, key);
	if (!svc || svc->count == 0)
		return NULL;
	bkey.slot = 1 + bpf_get_prandom_u32() % svc->count;
	return bpf_map_lookup_elem(&weir_lb4_backends, &bkey);
}

#endif /* WEIR_LIB_LB_H */

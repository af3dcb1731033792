/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * identity.h: which security identity an address has.
 *
 * weir_ipcache: hash, key struct weir_addr, value __u32 identity. Every pod
 * in the cluster (its label identity) and every node (host, remote-node).
 *
 * weir_cidr_ids: LPM trie, key struct cidr_key = { prefixlen, weir_addr },
 * value __u32 identity. Every prefix an ipBlock names, cidr and except
 * alike, numbered by the policy compiler. The longest match of an address
 * tells every ipBlock at once whether it contains the address; pod
 * addresses are looked up here too, since an ipBlock may cover them.
 *
 * An address the ipcache does not know is IDENTITY_WORLD, unless it lies
 * inside the cluster's pod CIDR, this node's or a peer's (weir_tunnels): then it is
 * a pod whose identity has not reached this node yet, IDENTITY_UNIDENTIFIED,
 * which policy.h denies wherever any policy applies (it could be any pod,
 * so no rule can be known to allow it). The CIDR lookup misses with
 * IDENTITY_WORLD.
 *
 * While the agent moves addresses from one identity to another, it first
 * maps them (ipcache entry or CIDR prefix) to IDENTITY_UNIDENTIFIED, then
 * rewrites the keys, then maps them to their new identity: in between,
 * they are denied wherever a policy applies rather than judged by keys
 * meant for another identity.
 *
 * A packet from the overlay carries its sender's identity (tunnel.h); the
 * hint passes it down to the policy lookup in place of the ipcache's.
 */
#ifndef WEIR_LIB_IDENTITY_H
#define WEIR_LIB_IDENTITY_H

#include "addr.h"
#include "tunnel.h"

/* Reserved identities (internal/policy/identity.go). */
#define IDENTITY_ANY 0
#define IDENTITY_HOST 1
#define IDENTITY_WORLD 2
#define IDENTITY_REMOTE_NODE 3
#define IDENTITY_UNIDENTIFIED 4
#define IDENTITY_MIN_CLUSTER 256
#define IDENTITY_MAX_CLUSTER 65535

#define CIDR_KEY_PREFIX_BITS 32 /* family + pad in front of the address */

struct cidr_key {
	__u32 prefixlen;
	struct weir_addr addr;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct weir_addr);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_ipcache SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 65536);
	__type(key, struct cidr_key);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_cidr_ids SEC(".maps");

/* identity_hint: addr's identity as the packet's sender vouched for it. */
struct identity_hint {
	__be32 addr;
	__u32 id; /* 0: no hint */
};

/* vouched_pod_identity is the identity a peer node's word (VNI, identity
 * option) gives one of its pods: a label identity or unidentified, never a
 * reserved one, which a pod address cannot have. */
__always_inline_fn __u32 vouched_pod_identity(__u32 id)
{
	if ((id >= IDENTITY_MIN_CLUSTER && id <= IDENTITY_MAX_CLUSTER) || id == IDENTITY_UNIDENTIFIED)
		return id;
	return IDENTITY_UNIDENTIFIED;
}

/* label_identity_v4 is an address's label identity from the ipcache. */
__always_inline_fn __u32 label_identity_v4(__be32 ip)
{
	struct weir_addr key;
	__u32 *id;

	weir_addr_from_v4(&key, ip);
	id = bpf_map_lookup_elem(&weir_ipcache, &key);
	if (id)
		return *id;
	if (in_cluster_cidr_v4(ip) || in_pod_cidr_v4(ip) || tunnel_lookup_v4(ip))
		return IDENTITY_UNIDENTIFIED;
	return IDENTITY_WORLD;
}

/* ipcache_identity_v4 is the ipcache's identity of ip, 0 if none. */
__always_inline_fn __u32 ipcache_identity_v4(__be32 ip)
{
	struct weir_addr key;
	__u32 *id;

	weir_addr_from_v4(&key, ip);
	id = bpf_map_lookup_elem(&weir_ipcache, &key);
	return id ? *id : 0;
}

/* peer_identities_v4 returns an address's label and CIDR identities. */
__always_inline_fn void peer_identities_v4(__be32 ip, const struct identity_hint *hint, __u32 *label,
					   __u32 *cidr)
{
	struct cidr_key key = { .prefixlen = CIDR_KEY_PREFIX_BITS + 32 };
	__u32 *id;

	if (hint && hint->id && hint->addr == ip)
		*label = hint->id;
	else
		*label = label_identity_v4(ip);
	weir_addr_from_v4(&key.addr, ip);
	id = bpf_map_lookup_elem(&weir_cidr_ids, &key);
	*cidr = id ? *id : IDENTITY_WORLD;
}

#endif /* WEIR_LIB_IDENTITY_H */

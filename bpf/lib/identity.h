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
 * Both miss with IDENTITY_WORLD.
 */
#ifndef WEIR_LIB_IDENTITY_H
#define WEIR_LIB_IDENTITY_H

#include "addr.h"

/* Reserved identities (internal/policy/identity.go). */
#define IDENTITY_ANY 0
#define IDENTITY_HOST 1
#define IDENTITY_WORLD 2

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

/* peer_identities_v4 returns an address's label and CIDR identities. */
__always_inline_fn void peer_identities_v4(__be32 ip, __u32 *label, __u32 *cidr)
{
	struct cidr_key key = { .prefixlen = CIDR_KEY_PREFIX_BITS + 32 };
	__u32 *id;

	weir_addr_from_v4(&key.addr, ip);
	id = bpf_map_lookup_elem(&weir_ipcache, &key.addr);
	*label = id ? *id : IDENTITY_WORLD;
	id = bpf_map_lookup_elem(&weir_cidr_ids, &key);
	*cidr = id ? *id : IDENTITY_WORLD;
}

#endif /* WEIR_LIB_IDENTITY_H */

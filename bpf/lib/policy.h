/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * policy.h: per-endpoint policy, decided in constant time.
 *
 * weir_ep_policy: hash, key __u32 (the endpoint's host-side ifindex), value
 * struct ep_policy. No entry, or a direction not enforced, allows all.
 *
 * weir_policy: LPM trie, key struct policy_key, value struct policy_entry.
 * The key's bytes after prefixlen, in matching order:
 *
 *   ifindex(4) dir(1) pad(3) identity(4) | proto(1) pad(1) | dport(2, big endian)
 *   \____________ always matched, 96 bits _/ \__ 16 bits __/ \__ 0..16 bits _/
 *
 * so an entry of prefixlen 96 allows every protocol, 112 one protocol on
 * every port, and 112+n the ports sharing the top n bits: a port range is a
 * handful of entries and a lookup never walks rules. Every entry allows;
 * a packet is allowed when its peer's label identity, its CIDR identity or
 * IDENTITY_ANY has a match (three lookups, whatever the rule count).
 */
#ifndef WEIR_LIB_POLICY_H
#define WEIR_LIB_POLICY_H

#include "identity.h"

#define POLICY_INGRESS 0
#define POLICY_EGRESS 1

#define POLICY_KEY_FIXED_BITS 96
#define POLICY_KEY_PROTO_BITS (POLICY_KEY_FIXED_BITS + 16)
#define POLICY_KEY_FULL_BITS (POLICY_KEY_PROTO_BITS + 16)

struct ep_policy {
	__u32 identity;
	__u8 enforce[2]; /* by POLICY_INGRESS / POLICY_EGRESS */
	__u8 pad[2];
};

struct policy_key {
	__u32 prefixlen;
	__u32 ifindex;
	__u8 dir;
	__u8 pad1[3];
	__u32 identity;
	__u8 proto;
	__u8 pad2;
	__be16 dport;
};

struct policy_entry {
	__u32 rule; /* the compiler's RuleID, named in verdict events */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct ep_policy);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_ep_policy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1 << 20);
	__type(key, struct policy_key);
	__type(value, struct policy_entry);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_policy SEC(".maps");

/* policy_match looks one peer identity up; it returns the rule or 0. */
__always_inline_fn __u32 policy_match(__u32 ifindex, __u8 dir, __u32 identity, __u8 proto, __be16 dport)
{
	struct policy_key key = {
		.prefixlen = POLICY_KEY_FULL_BITS,
		.ifindex = ifindex,
		.dir = dir,
		.identity = identity,
		.proto = proto,
		.dport = dport,
	};
	struct policy_entry *e = bpf_map_lookup_elem(&weir_policy, &key);

	return e ? (e->rule ? e->rule : 1) : 0;
}

/*
 * policy_check decides one direction of one local endpoint. It returns 1
 * to allow; *rule is the deciding rule (0 when no policy enforces) and
 * *peer_id the peer's label identity, for the verdict event.
 */
__always_inline_fn int policy_check(__u32 ifindex, __u8 dir, __be32 peer, __u8 proto, __be16 dport,
				    __u32 *rule, __u32 *peer_id)
{
	struct ep_policy *ep = bpf_map_lookup_elem(&weir_ep_policy, &ifindex);
	__u32 label, cidr;

	peer_identities_v4(peer, &label, &cidr);
	*peer_id = label;
	*rule = 0;
	if (!ep || !ep->enforce[dir & 1])
		return 1;
	*rule = policy_match(ifindex, dir, label, proto, dport);
	if (!*rule && cidr != label)
		*rule = policy_match(ifindex, dir, cidr, proto, dport);
	if (!*rule)
		*rule = policy_match(ifindex, dir, IDENTITY_ANY, proto, dport);
	return *rule != 0;
}

#endif /* WEIR_LIB_POLICY_H */

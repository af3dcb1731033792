/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * frag.h: which flow an IPv4 fragment belongs to.
 *
 * Only a datagram's first fragment carries its ports. weir_frags: LRU
 * hash, key struct frag_key (addresses, protocol and IP ID), value struct
 * frag_ports: the ports the first fragment carried, and whether the
 * node's stack translated its flow (nfct.h): the later fragments then go
 * to the stack with it, where the rest are judged as the first one's
 * flow (conntrack.h). Entries age out of the LRU; none is deleted on the
 * last fragment, since a middle one may arrive after it.
 */
#ifndef WEIR_LIB_FRAG_H
#define WEIR_LIB_FRAG_H

#include "common.h"

#define IP_MF_BIT 0x2000
#define IP_OFFSET_MASK 0x1fff

struct frag_key {
	__be32 saddr;
	__be32 daddr;
	__be16 id;
	__u8 proto;
	__u8 pad;
};

struct frag_ports {
	__be16 sport;
	__be16 dport;
	__u8 stack; /* the stack translated the flow: later fragments go to it */
	__u8 pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct frag_key);
	__type(value, struct frag_ports);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_frags SEC(".maps");

/* frag_key_v4 names the datagram a fragment belongs to. */
__always_inline_fn void frag_key_v4(const struct iphdr *ip, struct frag_key *fk)
{
	__builtin_memset(fk, 0, sizeof(*fk));
	fk->saddr = ip->saddr;
	fk->daddr = ip->daddr;
	fk->id = ip->id;
	fk->proto = ip->protocol;
}

/* frag_record_v4 notes a first fragment's ports (network order). */
__always_inline_fn void frag_record_v4(const struct iphdr *ip, __be16 sport, __be16 dport, __u8 stack)
{
	struct frag_ports fp = { .sport = sport, .dport = dport, .stack = stack };
	struct frag_key fk;

	frag_key_v4(ip, &fk);
	bpf_map_update_elem(&weir_frags, &fk, &fp, BPF_ANY);
}

/* frag_later_v4 reports whether ip is a fragment other than the first. */
__always_inline_fn int frag_later_v4(const struct iphdr *ip)
{
	return (ip->frag_off & bpf_htons(IP_OFFSET_MASK)) != 0;
}

#endif /* WEIR_LIB_FRAG_H */

/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * lbnat.h: the translations of flows from outside the cluster to a
 * Service (nodeport.h), kept both ways.
 *
 * weir_lb4_nat_fwd: LRU hash, key struct lb4_tuple (client -> frontend,
 * as the packet arrived), value struct lb4_nat (the backend it goes to).
 *
 * weir_lb4_nat_rev: LRU hash, key struct lb4_tuple (backend -> client, a
 * reply), value struct lb4_nat (the frontend the reply comes from). Also
 * read by lbflow.h: the frontend a translated flow's verdict event names.
 */
#ifndef WEIR_LIB_LBNAT_H
#define WEIR_LIB_LBNAT_H

#include "common.h"

/* struct lb4_tuple: one direction of a flow. */
struct lb4_tuple {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

/* struct lb4_nat: where a flow's packets are rewritten to. */
struct lb4_nat {
	__be32 addr;
	__be16 port;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__type(key, struct lb4_tuple);	/* client -> frontend */
	__type(value, struct lb4_nat);	/* the backend */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_lb4_nat_fwd SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 262144);
	__type(key, struct lb4_tuple);	/* backend -> client */
	__type(value, struct lb4_nat);	/* the frontend */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_lb4_nat_rev SEC(".maps");

#endif /* WEIR_LIB_LBNAT_H */

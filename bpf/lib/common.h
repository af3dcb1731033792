/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * common.h: includes and small helpers every Weir datapath program shares.
 *
 * Programs are configured at load time through the read-only globals below
 * (the loader rewrites them before the verifier sees the program), so one
 * object serves every node and mode instead of one build per #ifdef.
 */
#ifndef WEIR_LIB_COMMON_H
#define WEIR_LIB_COMMON_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define __always_inline_fn static __always_inline

#ifndef offsetof
#define offsetof(type, member) __builtin_offsetof(type, member)
#endif

/* Address families as stored in map keys; values match AF_INET/AF_INET6. */
#define WEIR_AF_INET 2
#define WEIR_AF_INET6 10

/* Errors helpers return, negated (include/uapi/asm-generic/errno-base.h). */
#define WEIR_EEXIST 17

/* Tunnel modes (load-time constant TUNNEL_MODE). */
#define WEIR_MODE_NATIVE 0
#define WEIR_MODE_VXLAN 1

/*
 * Load-time configuration. volatile keeps clang from folding the zero
 * initialisers; the loader sets the real values.
 */
volatile const __u32 TUNNEL_MODE = WEIR_MODE_VXLAN;
volatile const __u32 OVERLAY_IFINDEX = 0; /* the node's VXLAN device */
volatile const __u32 POD_CIDR_V4 = 0;      /* this node's pod CIDR, network order */
volatile const __u32 POD_CIDR_V4_MASK = 0; /* its netmask, network order */
/* Set only in the copies `weir policy trace` and tests run with
 * BPF_PROG_RUN, which cannot attach tunnel metadata: the sending node and
 * its VNI come from skb->cb[0] and cb[1] instead (tunnel.h). */
volatile const __u32 SENDER_FROM_CB = 0;

/* Native routing: put the sending pod's identity into the first packet of
 * each flow (nativeid.h); 0 for underlays that drop IPv4 options. */
volatile const __u32 SEND_IDENTITY_OPTION = 0;

/* No kube-proxy beside Weir: translate packets from outside the cluster to
 * Services' external addresses (nodeport.h). */
volatile const __u32 SERVE_EXTERNAL_SERVICES = 0;

/* A secret the cluster's nodes share (the agent derives it from the
 * kube-system namespace's UID), mixed into the hash Maglev picks a
 * NodePort flow's backend with: every node picks alike, and nobody
 * outside can choose source ports that all land on one backend. */
volatile const __u32 HASH_SEED_LO = 0;
volatile const __u32 HASH_SEED_HI = 0;

volatile const __u32 CLUSTER_CIDR_V4 = 0;      /* every pod address of the cluster */
volatile const __u32 CLUSTER_CIDR_V4_MASK = 0;

/* ctx_load reads a context field where it is written. Without the
 * barrier clang may sink the load into the branch that needs it and pick
 * its address by the branch taken; the verifier refuses a load from a
 * context or socket pointer moved that way. For 32-bit fields. */
#define ctx_load(field)                            \
	({                                         \
		__u32 __v = (field);               \
		asm volatile("" : "+r"(__v));      \
		__v;                               \
	})

/* in_pod_cidr_v4 reports whether ip belongs to this node's pod CIDR. */
__always_inline_fn int in_pod_cidr_v4(__be32 ip)
{
	return POD_CIDR_V4_MASK && (ip & POD_CIDR_V4_MASK) == POD_CIDR_V4;
}

/* in_cluster_cidr_v4 reports whether ip belongs to the cluster's pod CIDR. */
__always_inline_fn int in_cluster_cidr_v4(__be32 ip)
{
	return CLUSTER_CIDR_V4_MASK && (ip & CLUSTER_CIDR_V4_MASK) == CLUSTER_CIDR_V4;
}

/* ctx_data_ok reports whether len bytes from off lie inside the packet. */
__always_inline_fn int ctx_data_ok(struct __sk_buff *skb, __u32 off, __u32 len)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	return data + off + len <= data_end;
}

#endif /* WEIR_LIB_COMMON_H */

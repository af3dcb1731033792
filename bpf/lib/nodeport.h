/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * nodeport.h: Services reached from outside the cluster (NodePort,
 * externalIPs, load balancer IPs) when no kube-proxy runs beside Weir.
 *
 * Inside the cluster sockets are translated at connect() (sock.c). A
 * packet from outside is translated here, in from_netdev, before the
 * node's stack sees it:
 *
 *   new flow   the frontend's external entry (lb4_key.scope
 *              LB_SCOPE_EXTERNAL) picks a backend by Maglev consistent
 *              hashing of the flow's addresses and ports (weir_lb4_maglev,
 *              computed by the agent: internal/service/maglev.go), so a
 *              backend set that changes moves few flows, and every node
 *              picks alike; with session affinity, the client's backend.
 *              The flow's translation is kept both ways
 *              (weir_lb4_nat_fwd, weir_lb4_nat_rev)
 *   every packet of it
 *              destination rewritten to the backend, then handed to the
 *              stack, which routes it: to a local pod (the client's
 *              address kept), or towards the backend's node, marked
 *              WEIR_MARK_NODEPORT_SNAT so the stack's nftables rule
 *              (masquerade.go) gives it this node's address: the reply
 *              then comes back through this node, as kube-proxy's does
 *   replies    leave through to_netdev (host.c, tcx egress of the same
 *              device): their source, the backend, is rewritten back to
 *              the address and port the client asked for
 *
 * The stack's conntrack sees the translated flow (client to backend) from
 * its first packet, so a local pod's reply is no new connection and is not
 * masqueraded, and a remote backend's reply is de-SNATed by the stack
 * before to_netdev restores the frontend.
 *
 * An external entry with no backend is left untranslated, so the stack,
 * where nothing listens on a NodePort, answers with a TCP reset or an ICMP
 * port unreachable (kube-proxy's REJECT); with LB_FLAG_DROP (external
 * traffic policy Local and no endpoint on this node) the packet is
 * dropped, so a load balancer's health check steers away from the node.
 * Fragmented packets are not translated: their later fragments carry no
 * ports.
 */
#ifndef WEIR_LIB_NODEPORT_H
#define WEIR_LIB_NODEPORT_H

#include <linux/tcp.h>
#include <linux/udp.h>

#include "common.h"
#include "endpoint.h"
#include "lb.h"
#include "metrics.h"

/* The mark from_netdev sets on a translated packet whose backend is on
 * another node; masquerade.go's rule gives such packets the node's
 * address. 0xe8 as in routeProtocol, shifted clear of kube-proxy's bits. */
#define WEIR_MARK_NODEPORT_SNAT 0x00e80000

#define IP_MF_OFFSET 0x3fff /* more-fragments flag and offset bits */

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

/* LB_MAGLEV_SIZE is service.MaglevSize: entries of a Maglev table. */
#define LB_MAGLEV_SIZE 16381

/* struct lb4_maglev: a frontend's Maglev table, each entry a backend slot. */
struct lb4_maglev {
	__u16 slot[LB_MAGLEV_SIZE];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct lb4_key);	/* external scope */
	__type(value, struct lb4_maglev);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_lb4_maglev SEC(".maps");

/* nodeport_hash mixes a flow's tuple (a 64-bit finalizer), the same on
 * every node, so every node's Maglev table sends the flow alike. */
__always_inline_fn __u32 nodeport_hash(const struct lb4_tuple *t)
{
	__u64 h = ((__u64)t->saddr << 32 | t->daddr) ^
		  ((__u64)t->sport << 48 | (__u64)t->dport << 32 | t->proto);

	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ULL;
	h ^= h >> 33;
	return (__u32)h;
}

/* nodeport_maglev returns the backend the frontend's Maglev table gives
 * the flow, or NULL if it has no table (yet). */
__always_inline_fn const struct lb4_backend *nodeport_maglev(const struct lb4_key *key,
							     const struct lb4_tuple *fwd)
{
	struct lb4_backend_key bkey = { .svc = *key };
	const struct lb4_maglev *table;
	__u64 i;

	table = bpf_map_lookup_elem(&weir_lb4_maglev, key);
	if (!table)
		return NULL;
	i = (__u64)nodeport_hash(fwd) % LB_MAGLEV_SIZE;
	/* Keep the bound check on the register that indexes: the verifier
	 * must see i < LB_MAGLEV_SIZE where it is added to the pointer. */
	asm volatile("" : "+r"(i));
	if (i >= LB_MAGLEV_SIZE)
		return NULL;
	bkey.slot = table->slot[i];
	return bpf_map_lookup_elem(&weir_lb4_backends, &bkey);
}

/* nodeport_ports reads a TCP or UDP packet's ports; -1 for any other
 * packet, a fragment, or one too short. *syn says a TCP SYN without ACK. */
__always_inline_fn int nodeport_ports(struct __sk_buff *skb, const struct iphdr *ip, __u32 l4_off,
				      __be16 *sport, __be16 *dport, int *syn)
{
	struct tcphdr tcp;
	struct udphdr udp;

	if (ip->frag_off & bpf_htons(IP_MF_OFFSET))
		return -1;
	*syn = 0;
	switch (ip->protocol) {
	case IPPROTO_TCP:
		if (bpf_skb_load_bytes(skb, l4_off, &tcp, sizeof(tcp)) < 0)
			return -1;
		*sport = tcp.source;
		*dport = tcp.dest;
		*syn = tcp.syn && !tcp.ack;
		return 0;
	case IPPROTO_UDP:
		if (bpf_skb_load_bytes(skb, l4_off, &udp, sizeof(udp)) < 0)
			return -1;
		*sport = udp.source;
		*dport = udp.dest;
		return 0;
	}
	return -1;
}

/* nodeport_rewrite replaces an address (at addr_off) and a port (at
 * port_off) of the IPv4 packet at l3_off, fixing both checksums. */
__always_inline_fn int nodeport_rewrite(struct __sk_buff *skb, __u32 l3_off, __u32 l4_off, __u8 proto,
					__u32 addr_off, __be32 old_addr, __be32 new_addr,
					__u32 port_off, __be16 old_port, __be16 new_port)
{
	__u32 csum_off, flags = BPF_F_PSEUDO_HDR;

	if (proto == IPPROTO_TCP) {
		csum_off = l4_off + offsetof(struct tcphdr, check);
	} else {
		csum_off = l4_off + offsetof(struct udphdr, check);
		flags |= BPF_F_MARK_MANGLED_0; /* a zero UDP checksum stays "none" */
	}
	if (bpf_l4_csum_replace(skb, csum_off, old_addr, new_addr, flags | sizeof(new_addr)) < 0 ||
	    bpf_l4_csum_replace(skb, csum_off, old_port, new_port,
				(proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0) | sizeof(new_port)) < 0 ||
	    bpf_l3_csum_replace(skb, l3_off + offsetof(struct iphdr, check), old_addr, new_addr, sizeof(new_addr)) < 0 ||
	    bpf_skb_store_bytes(skb, l3_off + addr_off, &new_addr, sizeof(new_addr), 0) < 0 ||
	    bpf_skb_store_bytes(skb, l4_off + port_off, &new_port, sizeof(new_port), 0) < 0)
		return -1;
	return 0;
}

/* What nodeport_v4 did with a packet. */
enum nodeport_result {
	NODEPORT_NOT_OURS,   /* no external frontend: go on as before */
	NODEPORT_TRANSLATED, /* rewritten to its backend: to the stack */
	NODEPORT_DROP,       /* drop: no local backend, or a rewrite failed */
};

/* nodeport_keep_reply puts back the reply direction of a flow whose
 * forward entry is still there: the two LRU maps evict independently, and
 * a reply without its entry would leave with the pod's address. */
__always_inline_fn void nodeport_keep_reply(const struct lb4_tuple *fwd, const struct lb4_nat *to)
{
	struct lb4_tuple rev = {};
	struct lb4_nat front = {};

	rev.saddr = to->addr;
	rev.daddr = fwd->saddr;
	rev.sport = to->port;
	rev.dport = fwd->sport;
	rev.proto = fwd->proto;
	if (bpf_map_lookup_elem(&weir_lb4_nat_rev, &rev))
		return;
	front.addr = fwd->daddr;
	front.port = fwd->dport;
	bpf_map_update_elem(&weir_lb4_nat_rev, &rev, &front, BPF_ANY);
}

/* nodeport_pick finds the backend of a flow: the one it has, unless a new
 * TCP connection reuses the tuple, or a new one from the frontend. A
 * packet of a peer's pod (peer_pod) is never translated: its node's
 * sockets send what this node would serve straight to the backend, and
 * its replies would not come back through here. It reaches this node's
 * externalTrafficPolicy: Local NodePort only when this node has no
 * endpoint for it, and is dropped, as the packet of a client outside. */
__always_inline_fn enum nodeport_result nodeport_pick(int peer_pod, const struct lb4_tuple *fwd, int syn,
						      struct lb4_nat *to)
{
	struct lb4_key key = {};
	struct lb4_tuple rev = {};
	struct lb4_nat front = {};
	const struct lb4_service *svc;
	const struct lb4_backend *be;
	const struct lb4_nat *have;
	int affine;

	key.vip = fwd->daddr;
	key.port = fwd->dport;
	key.proto = fwd->proto;
	key.scope = LB_SCOPE_EXTERNAL;
	svc = bpf_map_lookup_elem(&weir_lb4_services, &key);
	if (!svc)
		return NODEPORT_NOT_OURS;
	if (peer_pod)
		return (svc->count == 0 && (svc->flags & LB_FLAG_DROP)) ? NODEPORT_DROP : NODEPORT_NOT_OURS;
	have = bpf_map_lookup_elem(&weir_lb4_nat_fwd, fwd);
	if (have && !syn) {
		*to = *have;
		nodeport_keep_reply(fwd, to);
		return NODEPORT_TRANSLATED;
	}
	/* Only a SYN opens a TCP flow: a stray segment of none (a scan, or
	 * a flow whose entry the LRU evicted) makes no entries, and the
	 * stack answers it. */
	if (fwd->proto == IPPROTO_TCP && !syn)
		return NODEPORT_NOT_OURS;
	if (svc->count == 0) /* the stack answers, or nothing does */
		return (svc->flags & LB_FLAG_DROP) ? NODEPORT_DROP : NODEPORT_NOT_OURS;
	be = svc->affinity_s ? NULL : nodeport_maglev(&key, fwd);
	if (!be)
		be = lb4_pick(&key, svc, fwd->saddr, &affine);
	if (!be)
		return NODEPORT_DROP; /* a slot mid-rewrite: the client retries */
	to->addr = be->addr;
	to->port = be->port;
	rev.saddr = be->addr;
	rev.daddr = fwd->saddr;
	rev.sport = be->port;
	rev.dport = fwd->sport;
	rev.proto = fwd->proto;
	front.addr = fwd->daddr;
	front.port = fwd->dport;
	if (bpf_map_update_elem(&weir_lb4_nat_rev, &rev, &front, BPF_ANY) < 0 ||
	    bpf_map_update_elem(&weir_lb4_nat_fwd, fwd, to, BPF_ANY) < 0)
		return NODEPORT_DROP;
	metric_inc(METRIC_NODEPORT_NEW);
	return NODEPORT_TRANSLATED;
}

/* nodeport_v4 translates a packet from outside the cluster to a Service's
 * external address (see the top of this file). */
__always_inline_fn enum nodeport_result nodeport_v4(struct __sk_buff *skb, const struct iphdr *ip, __u32 l3_off, int peer_pod)
{
	struct lb4_tuple fwd = {};
	struct lb4_nat to;
	__u32 l4_off = l3_off + ip->ihl * 4;
	enum nodeport_result res;
	int syn;

	if (!SERVE_EXTERNAL_SERVICES)
		return NODEPORT_NOT_OURS;
	if (nodeport_ports(skb, ip, l4_off, &fwd.sport, &fwd.dport, &syn) < 0)
		return NODEPORT_NOT_OURS;
	fwd.saddr = ip->saddr;
	fwd.daddr = ip->daddr;
	fwd.proto = ip->protocol;
	res = nodeport_pick(peer_pod, &fwd, syn, &to);
	if (res != NODEPORT_TRANSLATED)
		return res;
	if (nodeport_rewrite(skb, l3_off, l4_off, fwd.proto,
			     offsetof(struct iphdr, daddr), fwd.daddr, to.addr,
			     offsetof(struct tcphdr, dest), fwd.dport, to.port) < 0) {
		metric_inc(METRIC_DROP_MALFORMED);
		return NODEPORT_DROP;
	}
	if (!endpoint_lookup_v4(to.addr))
		skb->mark |= WEIR_MARK_NODEPORT_SNAT;
	metric_inc(METRIC_NODEPORT);
	return NODEPORT_TRANSLATED;
}

/* nodeport_reverse_v4 gives a reply leaving the node the address and port
 * its client asked for. Returns -1 if the packet could not be rewritten. */
__always_inline_fn int nodeport_reverse_v4(struct __sk_buff *skb, const struct iphdr *ip, __u32 l3_off)
{
	struct lb4_tuple rev = {};
	const struct lb4_nat *front;
	__u32 l4_off = l3_off + ip->ihl * 4;
	int syn;

	if (!SERVE_EXTERNAL_SERVICES)
		return 0;
	if (nodeport_ports(skb, ip, l4_off, &rev.sport, &rev.dport, &syn) < 0)
		return 0;
	rev.saddr = ip->saddr;
	rev.daddr = ip->daddr;
	rev.proto = ip->protocol;
	front = bpf_map_lookup_elem(&weir_lb4_nat_rev, &rev);
	if (!front)
		return 0;
	if (nodeport_rewrite(skb, l3_off, l4_off, rev.proto,
			     offsetof(struct iphdr, saddr), rev.saddr, front->addr,
			     offsetof(struct tcphdr, source), rev.sport, front->port) < 0)
		return -1;
	metric_inc(METRIC_NODEPORT_REPLY);
	return 0;
}

#endif /* WEIR_LIB_NODEPORT_H */

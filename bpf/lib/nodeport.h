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
 * A new flow sent to a backend on another node is reported as an event
 * of its own (VERDICT_FORWARDED): the backend's node judges its policy,
 * but sees this node's address as the source, and neither the client nor
 * the frontend, so only this node can say which Service the client used.
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
 * Fragments: a datagram's first fragment carries its ports and is
 * translated as any packet of its flow; the translation is noted under
 * the datagram's addresses and IP ID (weir_lb4_frags), and its later
 * fragments, which carry no ports, get the same address from there. A
 * later fragment that arrives before its first is left as it is.
 *
 * ICMP errors about a translated flow are translated with it, the quoted
 * packet too, so path MTU discovery and port unreachables work through a
 * NodePort: an error from outside about a reply (quoting frontend ->
 * client) goes to the backend, quoting backend -> client; an error
 * leaving for the client about a request (quoting client -> backend)
 * quotes client -> frontend, and comes from the frontend when the backend
 * sent it. The quoted IP header's checksum, its TCP or UDP checksum where
 * quoted, and the ICMP checksum are fixed.
 */
#ifndef WEIR_LIB_NODEPORT_H
#define WEIR_LIB_NODEPORT_H

#include <linux/tcp.h>
#include <linux/udp.h>

#include "common.h"
#include "endpoint.h"
#include "events.h"
#include "frag.h"
#include "identity.h"
#include "lb.h"
#include "lbflow.h"
#include "lbnat.h"
#include "metrics.h"

/* The mark from_netdev sets on a translated packet whose backend is on
 * another node; masquerade.go's rule gives such packets the node's
 * address. 0xe8 as in routeProtocol, shifted clear of kube-proxy's bits. */
#define WEIR_MARK_NODEPORT_SNAT 0x00e80000

/* ICMP error types whose message quotes the packet it is about. */
#define NODEPORT_ICMP_UNREACH 3
#define NODEPORT_ICMP_TIME_EXCEEDED 11
#define NODEPORT_ICMP_PARAMETER 12

/* struct lb4_frag_key: a fragmented datagram of a translated flow, as it
 * arrived (before the translation), and which way it went. */
struct lb4_frag_key {
	__be32 saddr;
	__be32 daddr;
	__be16 id;
	__u8 proto;
	__u8 dir; /* LB_FRAG_IN: from outside; LB_FRAG_OUT: a reply */
};

#define LB_FRAG_IN 0
#define LB_FRAG_OUT 1

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct lb4_frag_key);
	__type(value, struct lb4_nat); /* the address the datagram's fragments get */
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_lb4_frags SEC(".maps");

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

/* nodeport_hash mixes a flow's tuple with the cluster's seed (a 64-bit
 * finalizer), the same on every node, so every node's Maglev table sends
 * the flow alike. */
__always_inline_fn __u32 nodeport_hash(const struct lb4_tuple *t)
{
	__u64 seed = (__u64)HASH_SEED_HI << 32 | HASH_SEED_LO;
	__u64 h = ((__u64)t->saddr << 32 | t->daddr) ^ seed;

	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= ((__u64)t->sport << 48 | (__u64)t->dport << 32 | t->proto) ^ (seed >> 17 | seed << 47);
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
 * packet, a later fragment, or one too short. *syn says a TCP SYN
 * without ACK. */
__always_inline_fn int nodeport_ports(struct __sk_buff *skb, const struct iphdr *ip, __u32 l4_off,
				      __be16 *sport, __be16 *dport, int *syn)
{
	struct tcphdr tcp;
	struct udphdr udp;

	if (frag_later_v4(ip))
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

/* nodeport_first_fragment says whether ip is the first fragment of a
 * datagram that has more. */
__always_inline_fn int nodeport_first_fragment(const struct iphdr *ip)
{
	return (ip->frag_off & bpf_htons(IP_MF_BIT)) && !frag_later_v4(ip);
}

/* nodeport_frag_note notes where a datagram's first fragment was
 * translated to, under the datagram's addresses as it arrived, for its
 * later fragments. */
__always_inline_fn void nodeport_frag_note(__be32 saddr, __be32 daddr, __be16 id, __u8 proto, __u8 dir, __be32 to)
{
	struct lb4_frag_key k = {};
	struct lb4_nat v = {};

	k.saddr = saddr;
	k.daddr = daddr;
	k.id = id;
	k.proto = proto;
	k.dir = dir;
	v.addr = to;
	bpf_map_update_elem(&weir_lb4_frags, &k, &v, BPF_ANY);
}

/* nodeport_frag_follow gives a later fragment the address its datagram's
 * first fragment was translated to: the destination (LB_FRAG_IN) or the
 * source (LB_FRAG_OUT). Returns 1 if it did, 0 for a datagram of no
 * translated flow (or whose first fragment has not come yet), -1 if the
 * rewrite failed. */
__always_inline_fn int nodeport_frag_follow(struct __sk_buff *skb, const struct iphdr *ip, __u32 l3_off, __u8 dir,
					    __be32 *to)
{
	struct lb4_frag_key k = {};
	const struct lb4_nat *v;
	__be32 old = dir == LB_FRAG_IN ? ip->daddr : ip->saddr;
	__u32 off = dir == LB_FRAG_IN ? offsetof(struct iphdr, daddr) : offsetof(struct iphdr, saddr);
	__be32 addr;

	k.saddr = ip->saddr;
	k.daddr = ip->daddr;
	k.id = ip->id;
	k.proto = ip->protocol;
	k.dir = dir;
	v = bpf_map_lookup_elem(&weir_lb4_frags, &k);
	if (!v)
		return 0;
	addr = v->addr;
	if (bpf_l3_csum_replace(skb, l3_off + offsetof(struct iphdr, check), old, addr, sizeof(addr)) < 0 ||
	    bpf_skb_store_bytes(skb, l3_off + off, &addr, sizeof(addr), 0) < 0)
		return -1;
	*to = addr;
	return 1;
}

/* struct icmp_quote: an ICMP error and the packet it quotes. */
struct icmp_quote {
	__u32 icmp_off; /* the ICMP header */
	__u32 l3_off;	/* the quoted IP header */
	__u32 l4_off;	/* its TCP or UDP header */
	struct iphdr ip;
	__be16 sport;
	__be16 dport;
};

/* nodeport_icmp_quote reads an ICMP error (destination unreachable, time
 * exceeded, parameter problem) that quotes a TCP or UDP packet, or the
 * first fragment of one, with an IP header without options. -1 for any
 * other packet, and for an error that is itself fragmented. */
__always_inline_fn int nodeport_icmp_quote(struct __sk_buff *skb, const struct iphdr *ip, __u32 l3_off,
					   struct icmp_quote *q)
{
	__u8 type;

	if (ip->frag_off & bpf_htons(IP_MF_BIT | IP_OFFSET_MASK))
		return -1;
	q->icmp_off = l3_off + ip->ihl * 4;
	if (bpf_skb_load_bytes(skb, q->icmp_off, &type, sizeof(type)) < 0)
		return -1;
	if (type != NODEPORT_ICMP_UNREACH && type != NODEPORT_ICMP_TIME_EXCEEDED && type != NODEPORT_ICMP_PARAMETER)
		return -1;
	q->l3_off = q->icmp_off + 8;
	if (bpf_skb_load_bytes(skb, q->l3_off, &q->ip, sizeof(q->ip)) < 0)
		return -1;
	if (q->ip.version != 4 || q->ip.ihl != 5 || frag_later_v4(&q->ip) ||
	    (q->ip.protocol != IPPROTO_TCP && q->ip.protocol != IPPROTO_UDP))
		return -1;
	q->l4_off = q->l3_off + sizeof(struct iphdr);
	if (bpf_skb_load_bytes(skb, q->l4_off, &q->sport, sizeof(q->sport)) < 0 ||
	    bpf_skb_load_bytes(skb, q->l4_off + 2, &q->dport, sizeof(q->dport)) < 0)
		return -1;
	return 0;
}

/* nodeport_quote_answer is the flow direction answering the quoted
 * packet: its addresses and ports swapped. */
__always_inline_fn void nodeport_quote_answer(const struct icmp_quote *q, struct lb4_tuple *t)
{
	t->saddr = q->ip.daddr;
	t->daddr = q->ip.saddr;
	t->sport = q->dport;
	t->dport = q->sport;
	t->proto = q->ip.protocol;
}

/* csum_update16 is RFC 1624's update of a 16-bit one's complement
 * checksum for a 16-bit word that changes from from to to; words and
 * checksum as they are stored, so byte order does not matter. */
__always_inline_fn __u16 csum_update16(__u16 check, __u16 from, __u16 to)
{
	__u32 s = (__u32)(__u16)~check + (__u16)~from + to;

	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

__always_inline_fn __u16 csum_update32(__u16 check, __u32 from, __u32 to)
{
	return csum_update16(csum_update16(check, (__u16)from, (__u16)to), (__u16)(from >> 16), (__u16)(to >> 16));
}

/* nodeport_icmp_store writes size bytes (2 or 4) of the ICMP message at
 * off, keeping the ICMP checksum right. */
__always_inline_fn int nodeport_icmp_store(struct __sk_buff *skb, const struct icmp_quote *q, __u32 off,
					   __u32 from, __u32 to, __u32 size)
{
	if (bpf_l4_csum_replace(skb, q->icmp_off + 2, from, to, size) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, off, &to, size, 0);
}

/* nodeport_icmp_rewrite gives the quoted packet's source (src) or
 * destination the address addr and port port, fixing the quoted IP
 * header's checksum, its TCP or UDP checksum where the quote reaches it
 * (a zero UDP checksum says there is none), and the ICMP checksum. */
__always_inline_fn int nodeport_icmp_rewrite(struct __sk_buff *skb, const struct icmp_quote *q, int src, __be32 addr,
					     __be16 port)
{
	__be32 old_addr = src ? q->ip.saddr : q->ip.daddr;
	__be16 old_port = src ? q->sport : q->dport;
	__u16 old_ipc = q->ip.check, new_ipc = csum_update32(old_ipc, old_addr, addr);
	__u32 l4c_off = q->l4_off + (q->ip.protocol == IPPROTO_TCP ? offsetof(struct tcphdr, check)
								   : offsetof(struct udphdr, check));
	__u16 old_l4c, new_l4c;

	if (nodeport_icmp_store(skb, q, q->l3_off + (src ? offsetof(struct iphdr, saddr) : offsetof(struct iphdr, daddr)),
				old_addr, addr, 4) < 0 ||
	    nodeport_icmp_store(skb, q, q->l4_off + (src ? 0 : 2), old_port, port, 2) < 0 ||
	    nodeport_icmp_store(skb, q, q->l3_off + offsetof(struct iphdr, check), old_ipc, new_ipc, 2) < 0)
		return -1;
	if (bpf_skb_load_bytes(skb, l4c_off, &old_l4c, sizeof(old_l4c)) < 0 ||
	    (q->ip.protocol == IPPROTO_UDP && !old_l4c))
		return 0; /* not quoted, or none */
	new_l4c = csum_update16(csum_update32(old_l4c, old_addr, addr), old_port, port);
	if (q->ip.protocol == IPPROTO_UDP && !new_l4c)
		new_l4c = 0xffff;
	return nodeport_icmp_store(skb, q, l4c_off, old_l4c, new_l4c, 2);
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
						      struct lb4_nat *to, int *fresh)
{
	struct lb4_key key = {};
	struct lb4_tuple rev = {};
	struct lb4_nat front = {};
	const struct lb4_service *svc;
	const struct lb4_backend *be;
	const struct lb4_nat *have;
	struct lb4_nat had = {};
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
	if (have)
		had = *have; /* a SYN again: a retransmission, or the tuple reused */
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
	/* A retransmitted SYN goes where its first went (Maglev, affinity):
	 * the same flow, not a new one to report. */
	*fresh = !have || had.addr != to->addr || had.port != to->port;
	return NODEPORT_TRANSLATED;
}

/* nodeport_report_forward reports a new flow from outside, fwd, that this
 * node sent to to, a backend on another node (see the top of this file).
 * Like a verdict event it is not counted per packet, only per new flow. */
__always_inline_fn void nodeport_report_forward(const struct lb4_tuple *fwd, const struct lb4_nat *to)
{
	struct verdict_event ev = {};

	if (!events_on())
		return;
	ev.ts_ns = bpf_ktime_get_ns();
	ev.peer_id = ipcache_identity_v4(fwd->saddr);
	ev.saddr = fwd->saddr;
	ev.daddr = to->addr;
	ev.sport = fwd->sport;
	ev.dport = to->port;
	ev.proto = fwd->proto;
	ev.dir = POLICY_INGRESS;
	ev.verdict = VERDICT_FORWARDED;
	ev.svc_addr = fwd->daddr;
	ev.svc_port = fwd->dport;
	ev.svc_match = LB4_FLOW_NAT;
	event_emit(&ev);
}

/* nodeport_frag_in sends a later fragment from outside where its
 * datagram's first fragment went. */
__always_inline_fn enum nodeport_result nodeport_frag_in(struct __sk_buff *skb, const struct iphdr *ip, __u32 l3_off)
{
	__be32 to;

	switch (nodeport_frag_follow(skb, ip, l3_off, LB_FRAG_IN, &to)) {
	case 0:
		return NODEPORT_NOT_OURS;
	case 1:
		break;
	default:
		metric_inc(METRIC_DROP_MALFORMED);
		return NODEPORT_DROP;
	}
	if (!endpoint_lookup_v4(to))
		skb->mark |= WEIR_MARK_NODEPORT_SNAT;
	metric_inc(METRIC_NODEPORT);
	return NODEPORT_TRANSLATED;
}

/* nodeport_icmp_in sends an ICMP error from outside about a reply of a
 * translated flow (quoting frontend -> client, addressed to the frontend)
 * to the flow's backend, quoting backend -> client, as if the backend's
 * reply had drawn it. */
__always_inline_fn enum nodeport_result nodeport_icmp_in(struct __sk_buff *skb, const struct iphdr *ip, __u32 l3_off)
{
	struct icmp_quote q;
	struct lb4_tuple fwd = {};
	const struct lb4_nat *have;
	struct lb4_nat to;
	__be32 frontend = ip->daddr;

	if (nodeport_icmp_quote(skb, ip, l3_off, &q) < 0 || q.ip.saddr != frontend)
		return NODEPORT_NOT_OURS;
	nodeport_quote_answer(&q, &fwd);
	have = bpf_map_lookup_elem(&weir_lb4_nat_fwd, &fwd);
	if (!have)
		return NODEPORT_NOT_OURS;
	to = *have;
	if (nodeport_icmp_rewrite(skb, &q, 1, to.addr, to.port) < 0 ||
	    bpf_l3_csum_replace(skb, l3_off + offsetof(struct iphdr, check), frontend, to.addr, sizeof(to.addr)) < 0 ||
	    bpf_skb_store_bytes(skb, l3_off + offsetof(struct iphdr, daddr), &to.addr, sizeof(to.addr), 0) < 0) {
		metric_inc(METRIC_DROP_MALFORMED);
		return NODEPORT_DROP;
	}
	if (!endpoint_lookup_v4(to.addr))
		skb->mark |= WEIR_MARK_NODEPORT_SNAT;
	metric_inc(METRIC_NODEPORT);
	return NODEPORT_TRANSLATED;
}

/* nodeport_icmp_out gives an ICMP error leaving for the client of a
 * translated flow (quoting client -> backend) the quote the client's own
 * packet had, client -> frontend, and the frontend's address when the
 * backend sent it. Returns -1 if the packet could not be rewritten. */
__always_inline_fn int nodeport_icmp_out(struct __sk_buff *skb, const struct iphdr *ip, __u32 l3_off)
{
	struct icmp_quote q;
	struct lb4_tuple rev = {};
	const struct lb4_nat *have;
	struct lb4_nat front;
	__be32 sender = ip->saddr;

	if (nodeport_icmp_quote(skb, ip, l3_off, &q) < 0)
		return 0;
	nodeport_quote_answer(&q, &rev);
	have = bpf_map_lookup_elem(&weir_lb4_nat_rev, &rev);
	if (!have)
		return 0;
	front = *have;
	if (nodeport_icmp_rewrite(skb, &q, 0, front.addr, front.port) < 0)
		return -1;
	if (sender == q.ip.daddr &&
	    (bpf_l3_csum_replace(skb, l3_off + offsetof(struct iphdr, check), sender, front.addr, sizeof(front.addr)) < 0 ||
	     bpf_skb_store_bytes(skb, l3_off + offsetof(struct iphdr, saddr), &front.addr, sizeof(front.addr), 0) < 0))
		return -1;
	metric_inc(METRIC_NODEPORT_REPLY);
	return 0;
}

/* nodeport_v4 translates a packet from outside the cluster to a Service's
 * external address (see the top of this file). */
__always_inline_fn enum nodeport_result nodeport_v4(struct __sk_buff *skb, const struct iphdr *ip, __u32 l3_off, int peer_pod)
{
	struct lb4_tuple fwd = {};
	struct lb4_nat to;
	__u32 l4_off = l3_off + ip->ihl * 4;
	enum nodeport_result res;
	int syn, first, fresh = 0;
	__be16 id;

	if (!SERVE_EXTERNAL_SERVICES)
		return NODEPORT_NOT_OURS;
	if (frag_later_v4(ip))
		return peer_pod ? NODEPORT_NOT_OURS : nodeport_frag_in(skb, ip, l3_off);
	if (ip->protocol == IPPROTO_ICMP)
		return peer_pod ? NODEPORT_NOT_OURS : nodeport_icmp_in(skb, ip, l3_off);
	if (nodeport_ports(skb, ip, l4_off, &fwd.sport, &fwd.dport, &syn) < 0)
		return NODEPORT_NOT_OURS;
	fwd.saddr = ip->saddr;
	fwd.daddr = ip->daddr;
	fwd.proto = ip->protocol;
	id = ip->id;
	first = nodeport_first_fragment(ip);
	res = nodeport_pick(peer_pod, &fwd, syn, &to, &fresh);
	if (res != NODEPORT_TRANSLATED)
		return res;
	if (nodeport_rewrite(skb, l3_off, l4_off, fwd.proto,
			     offsetof(struct iphdr, daddr), fwd.daddr, to.addr,
			     offsetof(struct tcphdr, dest), fwd.dport, to.port) < 0) {
		metric_inc(METRIC_DROP_MALFORMED);
		return NODEPORT_DROP;
	}
	if (first)
		nodeport_frag_note(fwd.saddr, fwd.daddr, id, fwd.proto, LB_FRAG_IN, to.addr);
	if (!endpoint_lookup_v4(to.addr)) {
		skb->mark |= WEIR_MARK_NODEPORT_SNAT;
		if (fresh)
			nodeport_report_forward(&fwd, &to);
	}
	metric_inc(METRIC_NODEPORT);
	return NODEPORT_TRANSLATED;
}

/* nodeport_reverse_v4 gives a reply leaving the node the address and port
 * its client asked for. Returns -1 if the packet could not be rewritten. */
__always_inline_fn int nodeport_reverse_v4(struct __sk_buff *skb, const struct iphdr *ip, __u32 l3_off)
{
	struct lb4_tuple rev = {};
	const struct lb4_nat *have;
	struct lb4_nat front;
	__u32 l4_off = l3_off + ip->ihl * 4;
	int syn, first;
	__be16 id;

	if (!SERVE_EXTERNAL_SERVICES)
		return 0;
	if (frag_later_v4(ip)) {
		__be32 to;

		return nodeport_frag_follow(skb, ip, l3_off, LB_FRAG_OUT, &to) < 0 ? -1 : 0;
	}
	if (ip->protocol == IPPROTO_ICMP)
		return nodeport_icmp_out(skb, ip, l3_off);
	if (nodeport_ports(skb, ip, l4_off, &rev.sport, &rev.dport, &syn) < 0)
		return 0;
	rev.saddr = ip->saddr;
	rev.daddr = ip->daddr;
	rev.proto = ip->protocol;
	id = ip->id;
	first = nodeport_first_fragment(ip);
	have = bpf_map_lookup_elem(&weir_lb4_nat_rev, &rev);
	if (!have)
		return 0;
	front = *have;
	if (nodeport_rewrite(skb, l3_off, l4_off, rev.proto,
			     offsetof(struct iphdr, saddr), rev.saddr, front.addr,
			     offsetof(struct tcphdr, source), rev.sport, front.port) < 0)
		return -1;
	if (first)
		nodeport_frag_note(rev.saddr, rev.daddr, id, rev.proto, LB_FRAG_OUT, front.addr);
	metric_inc(METRIC_NODEPORT_REPLY);
	return 0;
}

#endif /* WEIR_LIB_NODEPORT_H */

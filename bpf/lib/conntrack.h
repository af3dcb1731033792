/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * conntrack.h: Weir's own connection table, so policy is decided on a
 * connection's first packet and its replies pass.
 *
 * weir_ct (TCP) and weir_ct_any (every other protocol): LRU hashes, key
 * struct ct_key (a flow in its original direction: the first packet's
 * addresses and ports), value struct ct_entry. A packet is looked up as it
 * is and reversed; a hit in either is its flow. Two tables, so the churn
 * of short UDP flows (DNS) never evicts an idle TCP connection, whose next
 * segment, being no SYN, could not start it again.
 *
 * weir_policy_rev: array of one __u32, the policy revision. The agent bumps
 * it after every policy change; an entry decided under an older revision
 * is decided again on its next packet, so a revoked connection stops at
 * once and a granted one needs no flush. A revoked entry is kept, marked
 * CT_DENIED, and every packet matching it in either direction is judged
 * again (and dropped while policy denies): were it deleted, the other
 * end's next packet (an ACK, a retransmission) would open a new flow in
 * the reverse direction, judged by the rules for that direction, and the
 * revoked connection would carry on through it.
 *
 * weir_ct_revoked: hash (not LRU), key struct ct_key (the flow's original
 * direction), value __u64 (last packet, ns). A second record of each
 * revoked flow that no pod can churn out of the table: were the LRU's
 * CT_DENIED entry evicted, the flow's next packet would otherwise be a
 * new flow. The agent deletes records idle for long (GCRevokedFlows); a
 * re-judgement that allows the flow again deletes its record at once.
 *
 * A TCP flow begins only with a SYN: any other TCP packet that matches no
 * tracked flow is dropped (counted as drop_no_flow), as a stateful
 * firewall drops INVALID, so a lost entry cannot be reopened from the
 * middle of a connection by either end.
 *
 * weir_frags: LRU hash, key struct frag_key (addresses, protocol and IP
 * ID of a fragmented datagram), value struct frag_ports (the ports its
 * first fragment carried). Later fragments have no ports; they are judged
 * as the flow of their first fragment, and dropped when it was not seen.
 *
 * ICMP errors (destination unreachable, time exceeded, parameter problem)
 * belong to the flow they quote: one that quotes a tracked, allowed flow
 * travelling the other way passes with it, as conntrack's RELATED does,
 * so a refused connection fails at once and path MTU discovery works.
 *
 * ct_policy_v4 is the one entry point: every hook calls it before it
 * delivers a packet. It judges only the ends of the flow that are local
 * endpoints of this node (egress of a local source, ingress of a local
 * destination); the other node judges its own, so each direction is
 * enforced where its pod lives.
 */
#ifndef WEIR_LIB_CONNTRACK_H
#define WEIR_LIB_CONNTRACK_H

#include "endpoint.h"
#include "events.h"
#include "frag.h"
#include "l7flow.h"
#include "lbflow.h"
#include "policy.h"

struct ct_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

struct ct_entry {
	__u64 last_ns;
	__u32 rev; /* weir_policy_rev when last decided */
	__u32 flags; /* CT_DENIED */
};

#define CT_DENIED 1
/* Its receiver's policy restricts it to HTTP rules: its bytes toward the
 * receiver pass only once the receiver's socket joined (l7flow.h). */
#define CT_L7 2
/* Its sender's policy restricts it to HTTP rules: its bytes pass only
 * from the sender's own socket, once that socket joined and its
 * message verdict judged them (l7flow.h, weir_l7_out). */
#define CT_L7_OUT 4

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct ct_key);
	__type(value, __u64);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_ct_revoked SEC(".maps");

#define CT_TCP_SYN 0x02
#define CT_TCP_ACK 0x10

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 131072);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_ct SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_ct_any SEC(".maps");

/* ct_lookup finds a flow in its protocol's table. */
__always_inline_fn struct ct_entry *ct_lookup(const struct ct_key *k)
{
	if (k->proto == IPPROTO_TCP)
		return bpf_map_lookup_elem(&weir_ct, k);
	return bpf_map_lookup_elem(&weir_ct_any, k);
}

/* ct_create tracks a flow in its protocol's table. */
__always_inline_fn long ct_create(const struct ct_key *k, const struct ct_entry *e)
{
	if (k->proto == IPPROTO_TCP)
		return bpf_map_update_elem(&weir_ct, k, e, BPF_ANY);
	return bpf_map_update_elem(&weir_ct_any, k, e, BPF_ANY);
}

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_policy_rev SEC(".maps");

__always_inline_fn __u32 policy_revision(void)
{
	__u32 zero = 0, *rev = bpf_map_lookup_elem(&weir_policy_rev, &zero);

	return rev ? *rev : 0;
}

/* ct_key_v4's answer for a later fragment whose first was not seen. */
#define CT_KEY_NO_FIRST_FRAGMENT (-2)

/*
 * ct_key_v4 fills key from an IPv4 packet; ports are 0 without L4 ports.
 * A later fragment takes the ports its first fragment recorded.
 */
__always_inline_fn int ct_key_v4(struct __sk_buff *skb, struct iphdr *ip, __u32 l3_off, struct ct_key *key)
{
	struct frag_ports *fp;
	struct frag_key fk;
	__be16 *ports;

	__builtin_memset(key, 0, sizeof(*key));
	key->saddr = ip->saddr;
	key->daddr = ip->daddr;
	key->proto = ip->protocol;
	if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP && ip->protocol != IPPROTO_SCTP)
		return 0;
	if (ip->frag_off & bpf_htons(IP_OFFSET_MASK)) {
		frag_key_v4(ip, &fk);
		fp = bpf_map_lookup_elem(&weir_frags, &fk);
		if (!fp)
			return CT_KEY_NO_FIRST_FRAGMENT;
		key->sport = fp->sport;
		key->dport = fp->dport;
		return 0; /* the entry stays: a middle fragment may come after the last */
	}
	ports = (void *)(long)skb->data + l3_off + (ip->ihl & 0xf) * 4;
	if ((void *)(ports + 2) > (void *)(long)skb->data_end)
		return -1;
	key->sport = ports[0];
	key->dport = ports[1];
	if (ip->frag_off & bpf_htons(IP_MF_BIT))
		frag_record_v4(ip, ports[0], ports[1], 0);
	return 0;
}

__always_inline_fn void ct_reverse(const struct ct_key *k, struct ct_key *r)
{
	__builtin_memset(r, 0, sizeof(*r));
	r->saddr = k->daddr;
	r->daddr = k->saddr;
	r->sport = k->dport;
	r->dport = k->sport;
	r->proto = k->proto;
}

/*
 * policy_judge_end judges one local end of a flow and reports its verdict;
 * it returns VERDICT_*. A Log rule makes even a quiet re-check report.
 * client names the flow's sender for lbflow.h: a local pod's ifindex, 0
 * for any other.
 */
__always_inline_fn int policy_judge_end(const struct ct_key *flow, const struct identity_hint *hint, __u32 ifindex,
					 __u8 dir, __u32 client, int report, __u32 *http)
{
	struct verdict_event ev = {};
	struct policy_verdict v;
	__be32 peer = dir == POLICY_EGRESS ? flow->daddr : flow->saddr;

	policy_check(ifindex, dir, peer, hint, flow->proto, flow->dport, &v, &ev.peer_id);
	if (http && v.verdict == VERDICT_ALLOWED && flow->proto == IPPROTO_TCP) {
		http[0] = v.http[0];
		http[1] = v.http[1];
		http[2] = v.http[2];
	}
	if (v.verdict == VERDICT_ALLOWED && !report && !v.log)
		return VERDICT_ALLOWED;
	ev.rule = v.rule;
	ev.log = v.log;
	ev.passed = v.passed;
	ev.stage = v.stage;
	ev.ts_ns = bpf_ktime_get_ns();
	ev.ifindex = ifindex;
	ev.saddr = flow->saddr;
	ev.daddr = flow->daddr;
	ev.sport = flow->sport;
	ev.dport = flow->dport;
	ev.proto = flow->proto;
	ev.dir = dir;
	ev.verdict = v.verdict;
	verdict_count(&ev);
	if (!events_on())
		return v.verdict;
	/* Only an event names the Service: no lookup with events off. */
	ev.svc_match = lb4_flow_frontend(client, flow->saddr, flow->sport, flow->daddr, flow->dport, flow->proto,
					 &ev.svc_addr, &ev.svc_port);
	event_emit(&ev);
	return v.verdict;
}

/* ct_http is what a decision restricts an allowed TCP flow to: the HTTP
 * sets of the receiver's ingress rules and of the sender's egress rules
 * (all 0: not restricted on that side). */
struct ct_http {
	__u32 in[L7_FLOW_SETS];
	__u32 out[L7_FLOW_SETS];
};

/*
 * policy_decide judges a flow (original direction) at its local ends and
 * returns VERDICT_*: the sender's egress first, then the receiver's
 * ingress. report: emit allowed events too (a new connection, not a
 * re-check). http (zeroed here) receives the HTTP sets the receiver's
 * ingress policy and the sender's egress policy restrict an allowed TCP
 * flow to.
 */
__always_inline_fn int policy_decide(const struct ct_key *flow, const struct identity_hint *hint, int report,
				     struct ct_http *http)
{
	const struct endpoint_info *src = endpoint_lookup_v4(flow->saddr);
	const struct endpoint_info *dst = endpoint_lookup_v4(flow->daddr);
	__u32 client = src ? src->ifindex : 0;
	int verdict;

	__builtin_memset(http, 0, sizeof(*http));
	if (src) {
		verdict = policy_judge_end(flow, hint, src->ifindex, POLICY_EGRESS, client, report, http->out);
		if (verdict != VERDICT_ALLOWED)
			return verdict;
	}
	if (dst)
		return policy_judge_end(flow, hint, dst->ifindex, POLICY_INGRESS, client, report, http->in);
	return VERDICT_ALLOWED;
}

/* ct_policy_v4's answer for a flow a Reject rule denies: the caller
 * answers the sender (reject.h) or drops. Not a TC verdict. */
#define CT_POLICY_REJECT 100

/* ct_denied counts a denial and says how to end the packet. A reject is
 * counted where it is answered, or dropped (reject.h). */
__always_inline_fn int ct_denied(int verdict)
{
	if (verdict == VERDICT_REJECTED)
		return CT_POLICY_REJECT;
	metric_inc(METRIC_DROP_POLICY);
	return TC_ACT_SHOT;
}

/*
 * ct_tcp_opens reports whether a packet may begin a flow: anything but
 * TCP, or a TCP SYN without ACK.
 */
__always_inline_fn int ct_tcp_opens(struct __sk_buff *skb, struct iphdr *ip, __u32 l3_off)
{
	__u8 flags;

	if (ip->protocol != IPPROTO_TCP)
		return 1;
	if (ip->frag_off & bpf_htons(IP_OFFSET_MASK))
		return 0;
	if (bpf_skb_load_bytes(skb, l3_off + (ip->ihl & 0xf) * 4 + 13, &flags, 1) < 0)
		return 0;
	return (flags & (CT_TCP_SYN | CT_TCP_ACK)) == CT_TCP_SYN;
}

/* The ICMP errors that quote the packet they are about. */
#define ICMP_ERR_DEST_UNREACH 3
#define ICMP_ERR_TIME_EXCEEDED 11
#define ICMP_ERR_PARAMETER_PROBLEM 12

/*
 * ct_icmp_related reports whether ip is an ICMP error about a tracked,
 * allowed flow: it goes back to the quoted packet's sender, and the
 * quoted packet's flow is in the table in either direction.
 */
__always_inline_fn int ct_icmp_related(struct __sk_buff *skb, struct iphdr *ip, __u32 l3_off)
{
	struct ct_key q = {}, rq;
	struct ct_entry *e;
	struct iphdr inner;
	__u32 off = l3_off + (ip->ihl & 0xf) * 4;
	__be16 ports[2];
	__u8 type;

	if (ip->protocol != IPPROTO_ICMP || (ip->frag_off & bpf_htons(IP_OFFSET_MASK)))
		return 0;
	if (bpf_skb_load_bytes(skb, off, &type, 1) < 0)
		return 0;
	if (type != ICMP_ERR_DEST_UNREACH && type != ICMP_ERR_TIME_EXCEEDED && type != ICMP_ERR_PARAMETER_PROBLEM)
		return 0;
	off += 8; /* type, code, checksum, unused or MTU */
	if (bpf_skb_load_bytes(skb, off, &inner, sizeof(inner)) < 0 || inner.version != 4 || inner.ihl < 5)
		return 0;
	if (inner.saddr != ip->daddr)
		return 0; /* an error goes back to the packet's sender */
	/* ... from the packet's destination, or from a router on the way,
	 * which is no pod: a pod may only report on flows sent to it. */
	if (ip->saddr != inner.daddr && (in_pod_cidr_v4(ip->saddr) || tunnel_lookup_v4(ip->saddr)))
		return 0;
	q.saddr = inner.saddr;
	q.daddr = inner.daddr;
	q.proto = inner.protocol;
	if ((inner.protocol == IPPROTO_TCP || inner.protocol == IPPROTO_UDP || inner.protocol == IPPROTO_SCTP) &&
	    !(inner.frag_off & bpf_htons(IP_OFFSET_MASK))) {
		if (bpf_skb_load_bytes(skb, off + (inner.ihl & 0xf) * 4, ports, sizeof(ports)) < 0)
			return 0;
		q.sport = ports[0];
		q.dport = ports[1];
	}
	e = ct_lookup(&q);
	if (!e) {
		ct_reverse(&q, &rq);
		e = ct_lookup(&rq);
	}
	return e && !(e->flags & CT_DENIED) && e->rev == policy_revision();
}

/* ct_revoke keeps a denied flow marked in the LRU and, where no pod can
 * churn it out, in weir_ct_revoked. */
__always_inline_fn void ct_revoke(struct ct_entry *e, const struct ct_key *orig)
{
	__u64 now = bpf_ktime_get_ns();

	e->flags |= CT_DENIED;
	if (bpf_map_update_elem(&weir_ct_revoked, orig, &now, BPF_ANY) < 0)
		metric_inc(METRIC_CT_REVOKED_FULL);
}

/* l7_flow_key is the receiver's socket's name for a flow (l7flow.h). */
__always_inline_fn void l7_flow_key(const struct ct_key *flow, struct l7_sock_key *k)
{
	k->remote = flow->saddr;
	k->local = flow->daddr;
	k->remote_port = bpf_ntohs(flow->sport);
	k->local_port = bpf_ntohs(flow->dport);
}

/* l7_out_key is the sender's socket's name for a flow (l7flow.h). */
__always_inline_fn void l7_out_key(const struct ct_key *flow, struct l7_sock_key *k)
{
	k->remote = flow->daddr;
	k->local = flow->saddr;
	k->remote_port = bpf_ntohs(flow->dport);
	k->local_port = bpf_ntohs(flow->sport);
}

/*
 * ct_l7_record writes one side's restriction of a flow: in map (whose
 * values begin with their L7_FLOW_SETS sets), the entry k gets http's
 * sets, or a new entry does (fresh: a zeroed value of the map's, its sets
 * filled here) when there is none or the flow is opening; the CT entry e
 * (if any) gets flag. No sets lift the restriction: an existing entry
 * keeps its other fields with sets 0, and e loses flag.
 */
__always_inline_fn int ct_l7_record(void *map, const struct l7_sock_key *k, const __u32 *http, __u32 *fresh,
				    struct ct_entry *e, __u32 flag, int opening)
{
	__u32 *sets;

	if (!http[0] && !http[1] && !http[2]) {
		if (!e || !(e->flags & flag))
			return 0;
		e->flags &= ~flag;
		sets = bpf_map_lookup_elem(map, k);
		if (sets)
			sets[0] = sets[1] = sets[2] = 0;
		return 0;
	}
	sets = opening ? NULL : bpf_map_lookup_elem(map, k);
	if (sets) {
		sets[0] = http[0];
		sets[1] = http[1];
		sets[2] = http[2];
	} else {
		fresh[0] = http[0];
		fresh[1] = http[1];
		fresh[2] = http[2];
		if (bpf_map_update_elem(map, k, fresh, BPF_ANY) < 0) {
			metric_inc(METRIC_DROP_L7_NOT_RECORDED);
			return -1;
		}
	}
	if (e)
		e->flags |= flag;
	return 0;
}

/* ct_l7_restrict_in is ct_l7_restrict's receiver side: weir_l7_flows. */
__always_inline_fn int ct_l7_restrict_in(const struct ct_key *flow, const __u32 *http, struct ct_entry *e,
					 int opening)
{
	struct l7_sock_key k;
	struct l7_flow fresh = {};

	l7_flow_key(flow, &k);
	return ct_l7_record(&weir_l7_flows, &k, http, fresh.sets, e, CT_L7, opening);
}

/* ct_l7_restrict_out is ct_l7_restrict's sender side: weir_l7_out. An
 * entry keeps its socket's cookie and judged mark when its sets change. */
__always_inline_fn int ct_l7_restrict_out(const struct ct_key *flow, const __u32 *http, struct ct_entry *e,
					  int opening)
{
	struct l7_sock_key k;
	struct l7_out_flow fresh = {};

	l7_out_key(flow, &k);
	return ct_l7_record(&weir_l7_out, &k, http, fresh.sets, e, CT_L7_OUT, opening);
}

/*
 * ct_l7_restrict records what the receiver's ingress and the sender's
 * egress policy restrict an allowed flow to, just decided into http:
 * each side's entry gets its sets (made not joined if it has none: a
 * connection a policy restricts once open never joined, and so carries
 * no more bytes), and the CT entry e (if any) CT_L7 or CT_L7_OUT.
 * Unrestricted, a flow keeps its entries with sets 0, so a socket that
 * joined passes every request. Returns -1 when the flow needs an entry
 * and none can be written: deny. A global function, verified once: its
 * callers in ct_policy_v4_opens do not each add its paths.
 */
__attribute__((noinline)) int ct_l7_restrict(const struct ct_key *flow, const struct ct_http *http, struct ct_entry *e,
					     int opening)
{
	if (!flow || !http || flow->proto != IPPROTO_TCP)
		return 0;
	if (ct_l7_restrict_in(flow, http->in, e, opening) < 0)
		return -1;
	return ct_l7_restrict_out(flow, http->out, e, opening);
}

/* The TCP flags the gates look at. */
#define CT_TCP_URG 0x20

/* ct_tcp_payload reads a TCP packet's payload length, sequence number and
 * flags: 0, or -1 for a packet whose header cannot be read. The length
 * is the IPv4 total length's, but from the skb for a GSO packet of more
 * than 64 KiB (total length 0); never the skb's when the total length is
 * set: a short frame padded to Ethernet's minimum carries no payload. */
__always_inline_fn int ct_tcp_payload(struct __sk_buff *skb, const struct iphdr *ip, __u32 l3_off, __u32 *len,
				      __u32 *seq, __u8 *flags)
{
	__u32 ihl = (ip->ihl & 0xf) * 4, hdr, end;
	__u8 th[2];

	if (bpf_skb_load_bytes(skb, l3_off + ihl + 12, th, 2) < 0)
		return -1;
	if (bpf_skb_load_bytes(skb, l3_off + ihl + 4, seq, 4) < 0)
		return -1;
	*seq = bpf_ntohl(*seq);
	*flags = th[1];
	hdr = l3_off + ihl + (th[0] >> 4) * 4;
	end = ip->tot_len ? l3_off + bpf_ntohs(ip->tot_len) : skb->len;
	*len = end > hdr ? end - hdr : 0;
	return 0;
}

/*
 * ct_l7_gate_in lets a packet of a CT_L7 flow in its original direction
 * (toward the restricted receiver) pass only when it carries no bytes of
 * the stream, or the receiver's socket joined: the reader sees every
 * byte before the application does.
 */
__always_inline_fn int ct_l7_gate_in(struct __sk_buff *skb, const struct iphdr *ip, __u32 l3_off,
				     const struct ct_key *flow)
{
	struct l7_sock_key k;
	struct l7_flow *f;
	__u32 len, seq;
	__u8 flags;

	if (!(ip->frag_off & bpf_htons(IP_OFFSET_MASK | IP_MF_BIT))) {
		if (ct_tcp_payload(skb, ip, l3_off, &len, &seq, &flags) < 0)
			goto drop;
		if (!len)
			return TC_ACT_OK; /* no payload: handshake, ACK, FIN, RST */
	}
	l7_flow_key(flow, &k);
	f = bpf_map_lookup_elem(&weir_l7_flows, &k);
	if (f && f->joined)
		return TC_ACT_OK;
drop:
	metric_inc(METRIC_DROP_L7_UNJOINED);
	return TC_ACT_SHOT;
}

/*
 * ct_l7_gate_out lets a packet of a CT_L7_OUT flow in its original
 * direction (from the restricted sender, at its veth) pass only when it
 * carries no bytes of the stream, or its bytes come from the sender's
 * socket that joined (the socket the skb still names is that socket:
 * not a raw or packet socket of the same pod forging its segments) and
 * lie below the mark its message verdict judged up to (never bytes TCP
 * sends on its own, such as a Fast Open SYN's data retransmitted), and
 * are not urgent. A fragment cannot be placed in the stream: dropped.
 */
__always_inline_fn int ct_l7_gate_out(struct __sk_buff *skb, const struct iphdr *ip, __u32 l3_off,
				      const struct ct_key *flow)
{
	struct l7_sock_key k;
	struct l7_out_flow *f;
	__u32 len, seq;
	__u8 flags;

	if (ip->frag_off & bpf_htons(IP_OFFSET_MASK | IP_MF_BIT))
		goto unjoined;
	if (ct_tcp_payload(skb, ip, l3_off, &len, &seq, &flags) < 0)
		goto unjoined;
	if (!len)
		return TC_ACT_OK;
	l7_out_key(flow, &k);
	f = bpf_map_lookup_elem(&weir_l7_out, &k);
	if (!f || !f->joined)
		goto unjoined;
	/* Urgent data (MSG_OOB) is taken out of the stream by a server that
	 * does not read it inline, so the server would read other requests
	 * than the verdict judged: it never leaves. */
	if (bpf_get_socket_cookie(skb) != f->cookie || (__s32)(seq + len - f->judged) > 0 || (flags & CT_TCP_URG)) {
		metric_inc(METRIC_DROP_L7_UNJUDGED);
		return TC_ACT_SHOT;
	}
	return TC_ACT_OK;
unjoined:
	metric_inc(METRIC_DROP_L7_UNJOINED);
	return TC_ACT_SHOT;
}

/* ct_l7_gate applies the gates of a flow's restrictions (CT entry
 * flags) to a packet in its original direction, its IPv4 header at
 * l3_off. A global function, verified once, as ct_l7_restrict. */
__attribute__((noinline)) int ct_l7_gate(struct __sk_buff *skb, __u32 l3_off, const struct ct_key *flow, __u32 flags)
{
	struct iphdr ip;

	if (!skb || !flow || bpf_skb_load_bytes(skb, l3_off, &ip, sizeof(ip)) < 0)
		return TC_ACT_SHOT;
	if ((flags & CT_L7) && ct_l7_gate_in(skb, &ip, l3_off, flow) != TC_ACT_OK)
		return TC_ACT_SHOT;
	if (flags & CT_L7_OUT)
		return ct_l7_gate_out(skb, &ip, l3_off, flow);
	return TC_ACT_OK;
}

/*
 * ct_policy_v4_opens returns TC_ACT_OK to let the packet on, TC_ACT_SHOT
 * when policy denies its flow, CT_POLICY_REJECT when a Reject rule does,
 * and sets *opens when the packet was allowed as the first of a new
 * flow. ip must be a validated header at l3_off; hint (or NULL) is the
 * identity the packet's sender carried; at_pod says the packet is a local
 * pod's, at its veth (from_container).
 */
__always_inline_fn int ct_policy_v4_opens(struct __sk_buff *skb, struct iphdr *ip, __u32 l3_off,
					  const struct identity_hint *hint, int *opens, int at_pod)
{
	struct ct_key key, rev_key, *orig = &key;
	struct ct_entry *e, fresh = {};
	__u32 rev = policy_revision();
	/* The sender's gate holds only at its pod's veth, where its packets
	 * still name their socket: the same flow met elsewhere (translated
	 * by the node's stack, whose receive path forgets the socket) was
	 * held there already. */
	__u32 gates = at_pod ? CT_L7 | CT_L7_OUT : CT_L7;
	struct ct_http http;
	__u64 *revoked;
	int verdict, rc;

	rc = ct_key_v4(skb, ip, l3_off, &key);
	if (rc == CT_KEY_NO_FIRST_FRAGMENT) {
		metric_inc(METRIC_DROP_FRAGMENT);
		return TC_ACT_SHOT;
	}
	if (rc < 0) {
		metric_inc(METRIC_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	ct_reverse(&key, &rev_key);
	e = ct_lookup(&key);
	if (!e) {
		e = ct_lookup(&rev_key);
		if (e)
			orig = &rev_key;
	}
	if (e && e->rev == rev && !(e->flags & CT_DENIED)) {
		e->last_ns = bpf_ktime_get_ns();
		if (!(e->flags & (CT_L7 | CT_L7_OUT)) || orig != &key)
			return TC_ACT_OK;
		/* A SYN of a restricted flow may open a new connection on
		 * the tuple (a port reused after a close deleted the flow's
		 * entries): decided again below, which writes the entries
		 * that are missing, for the new socket to join. */
		if (!ct_tcp_opens(skb, ip, l3_off))
			return ct_l7_gate(skb, l3_off, orig, e->flags & gates);
	}
	if (e) {
		/* Decided under an older policy, or revoked: decide again
		 * (allowed verdicts quietly; a drop is reported). */
		e->rev = rev;
		e->last_ns = bpf_ktime_get_ns();
		verdict = policy_decide(orig, hint, 0, &http);
		if (verdict == VERDICT_ALLOWED && ct_l7_restrict(orig, &http, e, 0) < 0)
			verdict = VERDICT_DENIED;
		if (verdict != VERDICT_ALLOWED) {
			ct_revoke(e, orig);
			return ct_denied(verdict);
		}
		if (e->flags & CT_DENIED) {
			e->flags &= ~CT_DENIED;
			bpf_map_delete_elem(&weir_ct_revoked, orig);
		}
		if ((e->flags & gates) && orig == &key)
			return ct_l7_gate(skb, l3_off, orig, e->flags & gates);
		return TC_ACT_OK;
	}

	/* No tracked flow. An ICMP error about one goes with it. */
	if (ct_icmp_related(skb, ip, l3_off)) {
		metric_inc(METRIC_CT_RELATED);
		return TC_ACT_OK;
	}
	/* A revoked flow whose LRU entry is gone stays revoked. */
	revoked = bpf_map_lookup_elem(&weir_ct_revoked, &key);
	if (!revoked) {
		orig = &rev_key;
		revoked = bpf_map_lookup_elem(&weir_ct_revoked, &rev_key);
	}
	if (revoked) {
		verdict = policy_decide(orig, hint, 0, &http);
		if (verdict == VERDICT_ALLOWED && ct_l7_restrict(orig, &http, &fresh, 0) < 0)
			verdict = VERDICT_DENIED;
		if (verdict != VERDICT_ALLOWED) {
			*revoked = bpf_ktime_get_ns();
			return ct_denied(verdict);
		}
		/* Granted again: the connection resumes where it was. */
		bpf_map_delete_elem(&weir_ct_revoked, orig);
		fresh.rev = rev;
		fresh.last_ns = bpf_ktime_get_ns();
		if (ct_create(orig, &fresh) < 0)
			metric_inc(METRIC_CT_FULL);
		if ((fresh.flags & gates) && orig == &key)
			return ct_l7_gate(skb, l3_off, orig, fresh.flags & gates);
		return TC_ACT_OK;
	}
	if (!ct_tcp_opens(skb, ip, l3_off)) {
		metric_inc(METRIC_DROP_NO_FLOW);
		return TC_ACT_SHOT;
	}
	verdict = policy_decide(&key, hint, 1, &http);
	if (verdict == VERDICT_ALLOWED && ct_l7_restrict(&key, &http, &fresh, 1) < 0)
		verdict = VERDICT_DENIED;
	if (verdict != VERDICT_ALLOWED)
		return ct_denied(verdict);
	fresh.rev = rev;
	fresh.last_ns = bpf_ktime_get_ns();
	if (ct_create(&key, &fresh) < 0)
		metric_inc(METRIC_CT_FULL); /* allowed; UDP is decided again next packet, TCP dropped as flowless */
	metric_inc(METRIC_CT_NEW);
	*opens = 1;
	/* A SYN that carries data (TCP Fast Open) waits for the join too. */
	if (fresh.flags & gates)
		return ct_l7_gate(skb, l3_off, &key, fresh.flags & gates);
	return TC_ACT_OK;
}

/* ct_policy_v4 is ct_policy_v4_opens for callers that do not ask, and
 * are not at a pod's veth. */
__always_inline_fn int ct_policy_v4(struct __sk_buff *skb, struct iphdr *ip, __u32 l3_off,
				    const struct identity_hint *hint)
{
	int opens = 0;

	return ct_policy_v4_opens(skb, ip, l3_off, hint, &opens, 0);
}

#endif /* WEIR_LIB_CONNTRACK_H */

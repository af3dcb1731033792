/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * conntrack.h: Weir's own connection table, so policy is decided on a
 * connection's first packet and its replies pass.
 *
 * weir_ct: LRU hash, key struct ct_key (a flow in its original direction:
 * the first packet's addresses and ports), value struct ct_entry. A packet
 * is looked up as it is and reversed; a hit in either is its flow.
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

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 131072);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_ct SEC(".maps");

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

/* ct_key_v4 fills key from an IPv4 packet; ports are 0 without L4 ports. */
__always_inline_fn int ct_key_v4(struct __sk_buff *skb, struct iphdr *ip, __u32 l3_off, struct ct_key *key)
{
	__be16 *ports;

	__builtin_memset(key, 0, sizeof(*key));
	key->saddr = ip->saddr;
	key->daddr = ip->daddr;
	key->proto = ip->protocol;
	if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP && ip->protocol != IPPROTO_SCTP)
		return 0;
	if (ip->frag_off & bpf_htons(0x1fff))
		return 0; /* a later fragment: judged by its flow's addresses only */
	ports = (void *)(long)skb->data + l3_off + (ip->ihl & 0xf) * 4;
	if ((void *)(ports + 2) > (void *)(long)skb->data_end)
		return -1;
	key->sport = ports[0];
	key->dport = ports[1];
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
 */
__always_inline_fn int policy_judge_end(const struct ct_key *flow, const struct identity_hint *hint, __u32 ifindex,
					 __u8 dir, int report)
{
	struct verdict_event ev = {};
	struct policy_verdict v;
	__be32 peer = dir == POLICY_EGRESS ? flow->daddr : flow->saddr;

	policy_check(ifindex, dir, peer, hint, flow->proto, flow->dport, &v, &ev.peer_id);
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
	event_emit(&ev);
	return v.verdict;
}

/*
 * policy_decide judges a flow (original direction) at its local ends and
 * returns VERDICT_*: the sender's egress first, then the receiver's
 * ingress. report: emit allowed events too (a new connection, not a
 * re-check).
 */
__always_inline_fn int policy_decide(const struct ct_key *flow, const struct identity_hint *hint, int report)
{
	const struct endpoint_info *src = endpoint_lookup_v4(flow->saddr);
	const struct endpoint_info *dst = endpoint_lookup_v4(flow->daddr);
	int verdict;

	if (src) {
		verdict = policy_judge_end(flow, hint, src->ifindex, POLICY_EGRESS, report);
		if (verdict != VERDICT_ALLOWED)
			return verdict;
	}
	if (dst)
		return policy_judge_end(flow, hint, dst->ifindex, POLICY_INGRESS, report);
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
 * ct_policy_v4 returns TC_ACT_OK to let the packet on, TC_ACT_SHOT when
 * policy denies its flow, CT_POLICY_REJECT when a Reject rule does. ip
 * must be a validated header at l3_off; hint (or NULL) is the identity the
 * packet's sender carried.
 */
__always_inline_fn int ct_policy_v4(struct __sk_buff *skb, struct iphdr *ip, __u32 l3_off,
				    const struct identity_hint *hint)
{
	struct ct_key key, rev_key, *orig = &key;
	struct ct_entry *e, fresh = {};
	__u32 rev = policy_revision();
	int verdict;

	if (ct_key_v4(skb, ip, l3_off, &key) < 0) {
		metric_inc(METRIC_DROP_MALFORMED);
		return TC_ACT_SHOT;
	}
	e = bpf_map_lookup_elem(&weir_ct, &key);
	if (!e) {
		ct_reverse(&key, &rev_key);
		e = bpf_map_lookup_elem(&weir_ct, &rev_key);
		if (e)
			orig = &rev_key;
	}
	if (e && e->rev == rev && !(e->flags & CT_DENIED)) {
		e->last_ns = bpf_ktime_get_ns();
		return TC_ACT_OK;
	}
	if (e) {
		/* Decided under an older policy, or revoked: decide again
		 * (allowed verdicts quietly; a drop is reported). */
		e->rev = rev;
		e->last_ns = bpf_ktime_get_ns();
		verdict = policy_decide(orig, hint, 0);
		if (verdict != VERDICT_ALLOWED) {
			e->flags |= CT_DENIED;
			return ct_denied(verdict);
		}
		e->flags &= ~CT_DENIED;
		return TC_ACT_OK;
	}
	verdict = policy_decide(&key, hint, 1);
	if (verdict != VERDICT_ALLOWED)
		return ct_denied(verdict);
	fresh.rev = rev;
	fresh.last_ns = bpf_ktime_get_ns();
	if (bpf_map_update_elem(&weir_ct, &key, &fresh, BPF_ANY) < 0)
		metric_inc(METRIC_CT_FULL); /* allowed, decided again next packet */
	metric_inc(METRIC_CT_NEW);
	return TC_ACT_OK;
}

#endif /* WEIR_LIB_CONNTRACK_H */

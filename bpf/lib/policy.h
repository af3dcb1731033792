/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * policy.h: per-endpoint policy of every kind, decided in constant time.
 *
 * weir_ep_policy: hash, key __u32 (the endpoint's host-side ifindex), value
 * struct ep_policy. No entry, or a direction with no flag, allows all.
 *
 * weir_policy: LPM trie, key struct policy_key, value struct policy_entry.
 * The key's bytes after prefixlen, in matching order:
 *
 *   ifindex(4) dir(1) pad(3) identity(4) | proto(1) pad(1) | dport(2, big endian)
 *   \____________ always matched, 96 bits _/ \__ 16 bits __/ \__ 0..16 bits _/
 *
 * so an entry of prefixlen 96 covers every protocol, 112 one protocol on
 * every port, and 112+n the ports sharing the top n bits: a port range is a
 * handful of entries and a lookup never walks rules. An entry holds what
 * decides its keys: a NetworkPolicy rule that allows, and per cluster
 * policy tier the first rule in precedence (its rank) and the first Log
 * rule. The compiler folds every shorter key into the longer ones, so the
 * longest match alone is right. A packet looks up its peer's label
 * identity, its CIDR identity and IDENTITY_ANY (three lookups, whatever the
 * rule count) and policy_decide_entries combines them in the precedence order
 * Admin tier -> NetworkPolicy -> Baseline tier -> allow, exactly as
 * internal/policy.Decide does.
 *
 * weir_policy_seq: array of one __u32, mapped into the agent's memory. The
 * agent adds one before each write to weir_ep_policy, weir_policy,
 * weir_ipcache or weir_cidr_ids, and writes one at a time. policy_check
 * reads it before and after its lookups: the same number means at most
 * the one write then under way landed while it read. One write changes
 * one entry, and no two lookups of a packet can see the same entry (their
 * keys differ in map or identity), so the packet saw one state the agent
 * passed through, never a blend of several. Any other number: it reads
 * again (policy_reread), and after POLICY_READ_TRIES denies at stage
 * closed (drop_policy_changing). The loads are plain: x86-64 keeps loads
 * in order; a weakly ordered CPU would need load-acquire here.
 */
#ifndef WEIR_LIB_POLICY_H
#define WEIR_LIB_POLICY_H

#include "identity.h"
#include "l7flow.h"
#include "metrics.h"

#define POLICY_INGRESS 0
#define POLICY_EGRESS 1

/* ep_policy.enforce[dir] bits */
#define POLICY_ENFORCE_NP 1    /* a NetworkPolicy selects the endpoint */
#define POLICY_ENFORCE_TIERS 2 /* a cluster policy selects it */
#define POLICY_ENFORCE_CLOSED 4 /* its last policy load failed: deny all until one succeeds */

#define POLICY_READ_TRIES 4

#define POLICY_KEY_FIXED_BITS 96
#define POLICY_KEY_PROTO_BITS (POLICY_KEY_FIXED_BITS + 16)
#define POLICY_KEY_FULL_BITS (POLICY_KEY_PROTO_BITS + 16)

/* Tiers and actions, as internal/policy numbers them. */
#define TIER_ADMIN 0
#define TIER_BASELINE 1
#define ACTION_NONE 0
#define ACTION_ACCEPT 1
#define ACTION_DENY 2
#define ACTION_PASS 3
#define ACTION_REJECT 4

/* Verdicts and the stage that gave them (internal/policy Verdict, Stage). */
#define VERDICT_ALLOWED 1
#define VERDICT_DENIED 2
#define VERDICT_REJECTED 3
/* Not a policy verdict: from_netdev translated a flow from outside to a
 * backend on another node, whose policy judges it (nodeport.h). */
#define VERDICT_FORWARDED 4
#define STAGE_UNENFORCED 0
#define STAGE_ADMIN 1
#define STAGE_NETWORKPOLICY 2
#define STAGE_NP_DEFAULT_DENY 3
#define STAGE_BASELINE 4
#define STAGE_DEFAULT 5
#define STAGE_UNIDENTIFIED 6 /* a pod address with no known identity yet */
#define STAGE_CLOSED 7       /* the endpoint's last policy load failed */

struct ep_policy {
	__u32 identity;
	__u8 enforce[2]; /* by POLICY_INGRESS / POLICY_EGRESS: POLICY_ENFORCE_* */
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

/* tier_match: a cluster policy rule; lower rank comes first. */
struct tier_match {
	__u32 rule;
	__u32 rank;
	__u8 action; /* ACTION_*; ACTION_NONE: no rule */
	__u8 pad[3];
};

struct policy_entry {
	__u32 allow; /* NetworkPolicy RuleID that allows, 0: none */
	struct tier_match tier[2]; /* by TIER_*: Accept, Deny, Reject or Pass */
	struct tier_match log[2];  /* by TIER_*: Log rules */
	/* The HTTP set (lib/l7match.h) allow is restricted to, 0: none.
	 * Appended last: an entry of a version without it reads as 0. */
	__u32 http;
};

/* policy_verdict is policy_decide_entries's answer (internal/policy.Decision). */
struct policy_verdict {
	__u32 rule;   /* deciding rule, 0 for none */
	__u32 log;    /* first Log rule passed, 0 for none */
	__u32 passed; /* the Pass rule that sent evaluation on, 0 for none */
	__u8 verdict; /* VERDICT_* */
	__u8 stage;   /* STAGE_* */
	__u8 pad[2];
	/* NetworkPolicy allowed only through rules with HTTP rules on the
	 * port: the HTTP sets of the allowing entries, one of which must
	 * allow each request (lib/l7flow.h). All 0: not restricted. */
	__u32 http[3];
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

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_policy_seq SEC(".maps");

/* policy_lookup finds the longest entry for one peer identity, or NULL. */
__always_inline_fn const struct policy_entry *policy_lookup(__u32 ifindex, __u8 dir, __u32 identity, __u8 proto,
							    __be16 dport)
{
	struct policy_key key = {
		.prefixlen = POLICY_KEY_FULL_BITS,
		.ifindex = ifindex,
		.dir = dir,
		.identity = identity,
		.proto = proto,
		.dport = dport,
	};

	return bpf_map_lookup_elem(&weir_policy, &key);
}

/* tier_before: a takes precedence over b (internal/policy Match.before). */
__always_inline_fn int tier_before(const struct tier_match *a, const struct tier_match *b)
{
	return a->action != ACTION_NONE && (b->action == ACTION_NONE || a->rank < b->rank);
}

/* tier_best copies the first-in-precedence match of one tier (log: the
 * Log slot) across the entries found into *best. */
__always_inline_fn void tier_best(const struct policy_entry *e0, const struct policy_entry *e1,
				  const struct policy_entry *e2, int tier, int log, struct tier_match *best)
{
	const struct policy_entry *found[3] = {e0, e1, e2};
	int i;

	__builtin_memset(best, 0, sizeof(*best));
#pragma unroll
	for (i = 0; i < 3; i++) {
		const struct tier_match *m;

		if (!found[i])
			continue;
		m = log ? &found[i]->log[tier & 1] : &found[i]->tier[tier & 1];
		if (tier_before(m, best))
			*best = *m;
	}
}

/* tier_log is the tier's first Log rule if it comes before the decision. */
__always_inline_fn __u32 tier_log(const struct policy_entry *e0, const struct policy_entry *e1,
				  const struct policy_entry *e2, int tier, const struct tier_match *decision)
{
	struct tier_match log;

	tier_best(e0, e1, e2, tier, 1, &log);
	if (log.action != ACTION_NONE && (decision->action == ACTION_NONE || log.rank < decision->rank))
		return log.rule;
	return 0;
}

/* tier_decided fills v when m ends evaluation (Accept, Deny, Reject). */
__always_inline_fn int tier_decided(const struct tier_match *m, __u8 stage, struct policy_verdict *v)
{
	switch (m->action) {
	case ACTION_ACCEPT:
		v->verdict = VERDICT_ALLOWED;
		break;
	case ACTION_DENY:
		v->verdict = VERDICT_DENIED;
		break;
	case ACTION_REJECT:
		v->verdict = VERDICT_REJECTED;
		break;
	case ACTION_PASS:
		v->passed = m->rule;
		return 0;
	default:
		return 0;
	}
	v->stage = stage;
	v->rule = m->rule;
	return 1;
}

/* policy_http_sets fills v->http when NetworkPolicy allowed only through
 * entries restricted to HTTP rules: one allowing entry without a set
 * lifts the restriction, as one NetworkPolicy rule without HTTP rules
 * does (internal/policy.Result.LookupHTTP). */
__always_inline_fn void policy_http_sets(const struct policy_entry *e0, const struct policy_entry *e1,
					 const struct policy_entry *e2, struct policy_verdict *v)
{
	const struct policy_entry *found[3] = {e0, e1, e2};
	int i;

#pragma unroll
	for (i = 0; i < 3; i++) {
		if (!found[i] || !found[i]->allow)
			continue;
		if (!found[i]->http) {
			__builtin_memset(v->http, 0, sizeof(v->http));
			return;
		}
		v->http[i] = found[i]->http;
	}
}

/* policy_tiered_sets: when an entry found carries conditional cluster
 * rules (its set marked L7_SET_TIERED), an allowed flow is restricted to
 * the entries' sets whatever stage allowed it, so that its requests go
 * to user space, which walks the precedence order for each (l7flow.h).
 * The agent writes such an entry's tier match as the earlier of its first
 * rule without HTTP rules and its first conditional Accept or Pass (as
 * an Accept): the connection's own decision then needs nothing more
 * here (internal/policy.Decide). */
__always_inline_fn void policy_tiered_sets(const struct policy_entry *e0, const struct policy_entry *e1,
					   const struct policy_entry *e2, struct policy_verdict *v)
{
	__u32 h0 = e0 ? e0->http : 0, h1 = e1 ? e1->http : 0, h2 = e2 ? e2->http : 0;

	if (!((h0 | h1 | h2) & L7_SET_TIERED))
		return;
	v->http[0] = h0;
	v->http[1] = h1;
	v->http[2] = h2;
}

/* policy_decide_order walks the three entries in precedence order. */
__always_inline_fn void policy_decide_order(__u8 flags, const struct policy_entry *e0,
					    const struct policy_entry *e1, const struct policy_entry *e2,
					    struct policy_verdict *v)
{
	struct tier_match m;

	tier_best(e0, e1, e2, TIER_ADMIN, 0, &m);
	v->log = tier_log(e0, e1, e2, TIER_ADMIN, &m);
	if (tier_decided(&m, STAGE_ADMIN, v))
		return;
	if (flags & POLICY_ENFORCE_NP) {
		v->rule = e0 && e0->allow ? e0->allow : e1 && e1->allow ? e1->allow : e2 && e2->allow ? e2->allow : 0;
		v->verdict = v->rule ? VERDICT_ALLOWED : VERDICT_DENIED;
		v->stage = v->rule ? STAGE_NETWORKPOLICY : STAGE_NP_DEFAULT_DENY;
		if (v->rule)
			policy_http_sets(e0, e1, e2, v);
		return;
	}
	tier_best(e0, e1, e2, TIER_BASELINE, 0, &m);
	if (!v->log)
		v->log = tier_log(e0, e1, e2, TIER_BASELINE, &m);
	if (tier_decided(&m, STAGE_BASELINE, v))
		return;
	v->verdict = VERDICT_ALLOWED;
	v->stage = STAGE_DEFAULT;
}

/* policy_decide_entries combines the three entries in precedence order. */
__always_inline_fn void policy_decide_entries(__u8 flags, const struct policy_entry *e0,
					      const struct policy_entry *e1, const struct policy_entry *e2,
					      struct policy_verdict *v)
{
	policy_decide_order(flags, e0, e1, e2, v);
	if (v->verdict == VERDICT_ALLOWED)
		policy_tiered_sets(e0, e1, e2, v);
}

/* policy_query is what policy_read decides: one direction of one packet. */
struct policy_query {
	__u32 ifindex;
	__be32 peer;
	struct identity_hint hint; /* id 0: none */
	__be16 dport;
	__u8 dir;
	__u8 proto;
};

/*
 * policy_read decides one direction from the maps as they are now. It is a
 * global function, verified once on its own: policy_check calls it up to
 * POLICY_READ_TRIES times without multiplying the paths the verifier walks.
 */
__attribute__((noinline)) int policy_read(const struct policy_query *q, struct policy_verdict *v, __u32 *peer_id)
{
	const struct policy_entry *by_label, *by_cidr = NULL, *any;
	struct ep_policy *ep;
	__u32 label, cidr, ifindex;
	__u8 flags, dir;

	if (!q || !v || !peer_id)
		return 0;
	ifindex = q->ifindex;
	dir = q->dir & 1;
	__builtin_memset(v, 0, sizeof(*v));
	v->verdict = VERDICT_ALLOWED;
	v->stage = STAGE_UNENFORCED;
	peer_identities_v4(q->peer, &q->hint, &label, &cidr);
	*peer_id = label;
	ep = bpf_map_lookup_elem(&weir_ep_policy, &ifindex);
	if (!ep)
		return 0;
	flags = ep->enforce[dir];
	if (!flags)
		return 0;
	if (flags & POLICY_ENFORCE_CLOSED) {
		v->verdict = VERDICT_DENIED;
		v->stage = STAGE_CLOSED;
		return 0;
	}
	if (label == IDENTITY_UNIDENTIFIED || cidr == IDENTITY_UNIDENTIFIED) {
		/* Fail closed: it may be a pod some rule denies, or an address
		 * the agent is moving to another identity. */
		v->verdict = VERDICT_DENIED;
		v->stage = STAGE_UNIDENTIFIED;
		return 0;
	}
	by_label = policy_lookup(ifindex, dir, label, q->proto, q->dport);
	if (cidr != label)
		by_cidr = policy_lookup(ifindex, dir, cidr, q->proto, q->dport);
	any = policy_lookup(ifindex, dir, IDENTITY_ANY, q->proto, q->dport);
	policy_decide_entries(flags, by_label, by_cidr, any, v);
	return 0;
}

/*
 * policy_check decides one direction of one local endpoint into *v;
 * *peer_id is the peer's label identity, for the verdict event. hint, if
 * not NULL, is the identity the packet's sender carried (tunnel.h). The
 * decision is read from one state of the maps (weir_policy_seq above).
 */
__always_inline_fn void policy_check(__u32 ifindex, __u8 dir, __be32 peer, const struct identity_hint *hint,
				     __u8 proto, __be16 dport, struct policy_verdict *v, __u32 *peer_id)
{
	struct policy_query q = {
		.ifindex = ifindex,
		.peer = peer,
		.dport = dport,
		.dir = dir,
		.proto = proto,
	};
	__u32 zero = 0, before, i;
	volatile __u32 *seq = bpf_map_lookup_elem(&weir_policy_seq, &zero);

	if (hint)
		q.hint = *hint;
	for (i = 0; i < POLICY_READ_TRIES; i++) {
		before = seq ? *seq : 0;
		policy_read(&q, v, peer_id);
		if (!seq || *seq == before)
			return;
		metric_inc(METRIC_POLICY_REREAD);
	}
	metric_inc(METRIC_DROP_POLICY_CHANGING);
	__builtin_memset(v, 0, sizeof(*v));
	v->verdict = VERDICT_DENIED;
	v->stage = STAGE_CLOSED;
}

#endif /* WEIR_LIB_POLICY_H */

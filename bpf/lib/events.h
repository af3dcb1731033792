/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * events.h: verdict events for `weir observe`.
 *
 * weir_events: ring buffer of struct verdict_event, one per drop and one
 * per newly allowed connection (not per packet), naming the endpoint, the
 * peer identity and the rule. A full ring drops the event, never the
 * packet; the loss is counted (METRIC_EVENT_LOST).
 */
#ifndef WEIR_LIB_EVENTS_H
#define WEIR_LIB_EVENTS_H

#include "common.h"
#include "metrics.h"
#include "policy.h"

struct verdict_event {
	__u64 ts_ns;
	__u32 ifindex;  /* the local endpoint the verdict is about */
	__u32 peer_id;  /* the peer's label identity */
	__u32 rule;     /* deciding RuleID; 0: no rule decided (see stage) */
	__be32 saddr;   /* the flow as its first packet had it */
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 dir;       /* POLICY_INGRESS / POLICY_EGRESS of ifindex */
	__u8 verdict;   /* VERDICT_* (policy.h) */
	__u8 stage;     /* STAGE_* (policy.h) */
	__u32 log;      /* a Log rule the evaluation passed, 0: none */
	__u32 passed;   /* the Pass rule that sent evaluation on, 0: none */
	__be32 svc_addr; /* the Service frontend the client named (lbflow.h), 0: none */
	__be16 svc_port;
	__u8 svc_match;  /* LB4_FLOW_* (lbflow.h): how svc_addr was found */
	__u8 pad;
};

/* The ring buffer has no value type; this keeps the event's layout in BTF
 * for the Go reader's generated struct. */
const struct verdict_event *unused_verdict_event __attribute__((unused));

#define EVENTS_RING_SIZE (1 << 20)

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, EVENTS_RING_SIZE);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_events SEC(".maps");

struct flow_config {
	__u32 no_events;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct flow_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_flow_config SEC(".maps");

/*
 * weir_verdicts: per-CPU hash, key struct verdict_count_key, value __u64:
 * every reported verdict counted by what the metrics name (the deciding
 * and Log rules, verdict, direction, stage), whether or not events are on.
 * The endpoint is in the key only for a drop no rule decided (a
 * NetworkPolicy default deny is named by the pod's namespace). A full map
 * loses the count, not the packet (METRIC_VERDICT_COUNT_FULL).
 */
struct verdict_count_key {
	__u32 rule;
	__u32 log;
	__u32 ifindex;
	__u8 verdict;
	__u8 dir;
	__u8 stage;
	__u8 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct verdict_count_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_verdicts SEC(".maps");

/* verdict_count counts one reported verdict. */
__always_inline_fn void verdict_count(const struct verdict_event *ev)
{
	struct verdict_count_key key = {
		.rule = ev->rule,
		.log = ev->log,
		.verdict = ev->verdict,
		.dir = ev->dir,
		.stage = ev->stage,
	};
	__u64 one = 1, *n;

	if (!ev->rule && ev->verdict != VERDICT_ALLOWED)
		key.ifindex = ev->ifindex;
	n = bpf_map_lookup_elem(&weir_verdicts, &key);
	if (n) {
		*n += 1; /* this CPU's own slot */
		return;
	}
	if (bpf_map_update_elem(&weir_verdicts, &key, &one, BPF_NOEXIST) < 0 &&
	    !bpf_map_lookup_elem(&weir_verdicts, &key))
		metric_inc(METRIC_VERDICT_COUNT_FULL);
}

/* events_on reports whether verdict events are written (weir_flow_config). */
__always_inline_fn int events_on(void)
{
	__u32 zero = 0;
	const struct flow_config *cfg = bpf_map_lookup_elem(&weir_flow_config, &zero);

	return !cfg || !cfg->no_events;
}

/*
 * event_emit writes one event, events being on, without waking the reader:
 * the agent polls the ring every few tens of milliseconds, so a burst of
 * new connections costs one wakeup, not one per connection. Once an eighth
 * of the ring is waiting the reader is woken at once, long before events
 * would be lost.
 */
__always_inline_fn void event_emit(const struct verdict_event *ev)
{
	__u64 flags = BPF_RB_NO_WAKEUP;

	if (bpf_ringbuf_query(&weir_events, BPF_RB_AVAIL_DATA) > EVENTS_RING_SIZE / 8)
		flags = BPF_RB_FORCE_WAKEUP;
	if (bpf_ringbuf_output(&weir_events, (void *)ev, sizeof(*ev), flags) < 0)
		metric_inc(METRIC_EVENT_LOST);
}

#endif /* WEIR_LIB_EVENTS_H */

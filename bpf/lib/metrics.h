/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * metrics.h: per-CPU packet counters by datapath outcome.
 *
 * The agent sums the CPUs and exports the totals; tests read them to prove
 * which path a real packet took (for example that it was redirected to the
 * peer pod rather than routed by the host).
 */
#ifndef WEIR_LIB_METRICS_H
#define WEIR_LIB_METRICS_H

#include "common.h"

enum weir_metric {
	METRIC_REDIRECT_LOCAL = 0, /* delivered into a local pod with redirect_peer */
	METRIC_REDIRECT_TUNNEL,    /* sent to a remote node through the overlay */
	METRIC_REDIRECT_NATIVE,    /* sent to a remote node through the FIB */
	METRIC_PASS_HOST,          /* handed to the node's stack */
	METRIC_ARP_REPLY,          /* ARP for the gateway answered */
	METRIC_DROP_SPOOF,         /* source address not owned by the sending pod */
	METRIC_DROP_MALFORMED,     /* truncated or unparsable header */
	METRIC_DROP_TUNNEL,        /* tunnel key could not be set */
	METRIC_PASS_STACK_NAT,     /* handed to the stack to reverse its NAT (nfct.h) */
	METRIC_DROP_POLICY,        /* denied by network policy (conntrack.h) */
	METRIC_CT_NEW,             /* a new flow allowed and tracked */
	METRIC_CT_FULL,            /* a flow allowed but not tracked: table full */
	METRIC_EVENT_LOST,         /* a verdict event lost: ring buffer full */
	METRIC_SOCK_LB,            /* a pod's socket sent to a Service backend (sock.c) */
	METRIC_SOCK_LB_MISS,       /* a Service address left to kube-proxy: no backend slot */
	METRIC_POLICY_REJECT,      /* denied by a Reject rule and answered (reject.h) */
	METRIC_DROP_IPV6,          /* IPv6 from a pod other than neighbour discovery (podlink.h) */
	METRIC_DROP_VLAN,          /* a VLAN-tagged frame from a pod (podlink.h) */
	METRIC_DROP_ETHERTYPE,     /* a frame from a pod neither ARP, IPv4 nor IPv6 (podlink.h) */
	METRIC_DROP_TUNNEL_SOURCE, /* overlay or underlay packet from a source its sender cannot own */
	METRIC_DROP_NO_FLOW,       /* a TCP packet of no tracked flow that is no SYN (conntrack.h) */
	METRIC_DROP_FRAGMENT,      /* a later fragment whose first was not seen (conntrack.h) */
	METRIC_CT_RELATED,         /* an ICMP error passed with the flow it quotes (conntrack.h) */
	METRIC_CT_REVOKED_FULL,    /* a revoked flow not recorded outside the LRU: table full */
	METRIC_DROP_BROADCAST,     /* IPv4 broadcast or multicast from a pod (podlink.h) */
	METRIC_POLICY_REREAD,      /* a decision read again: policy changed while it read (policy.h) */
	METRIC_DROP_POLICY_CHANGING, /* denied: policy kept changing through every read (policy.h) */
	METRIC_VERDICT_COUNT_FULL, /* a verdict not counted for the metrics: weir_verdicts full (events.h) */
	METRIC_IDENTITY_OPTION_SENT, /* a flow-opening packet routed natively with its identity (nativeid.h) */
	METRIC_IDENTITY_OPTION_READ, /* a natively routed packet judged by the identity its node sent */
	METRIC_DROP_IDENTITY_OPTION, /* an identity option a pod forged, or one that could not be added or stripped */
	METRIC_SOCK_LB_REJECT,     /* a socket refused: the Service it named has no backend (sock.c) */
	METRIC_SOCK_LB_AFFINITY,   /* a socket sent to the backend its client had (session affinity, sock.c) */
	METRIC_SOCK_LB_CLOSED,     /* a socket closed: its Service no longer has the backend it was sent to (sock_iter.c) */
	METRIC_NODEPORT_NEW,       /* a flow from outside to a Service's external address given a backend (nodeport.h) */
	METRIC_NODEPORT,           /* a packet from outside translated to its Service backend (nodeport.h) */
	METRIC_NODEPORT_REPLY,     /* a reply leaving with the Service address its client asked for (nodeport.h) */
	METRIC_DROP_NODEPORT,      /* a packet from outside to a Service address with no backend here, or not rewritable */
	METRIC_DROP_L7_UNJOINED,   /* bytes of a flow L7 policy restricts before its socket joined the reader (conntrack.h) */
	METRIC_DROP_L7_NOT_RECORDED, /* a flow L7 policy restricts denied: weir_l7_flows refused its entry (conntrack.h) */
	METRIC_DROP_L7_UNJUDGED,   /* bytes of a flow egress L7 policy restricts not sent through its joined socket's verdict (conntrack.h) */
	METRIC_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, METRIC_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_metrics SEC(".maps");

__always_inline_fn void metric_inc(__u32 id)
{
	__u64 *v = bpf_map_lookup_elem(&weir_metrics, &id);

	if (v)
		*v += 1;
}

#endif /* WEIR_LIB_METRICS_H */

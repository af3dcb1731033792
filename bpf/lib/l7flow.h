/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * l7flow.h: the connections L7 policy restricts, from the decision on
 * their SYN to the socket that reads them.
 *
 * weir_l7_flows: LRU hash, key struct l7_sock_key (the server's view of
 * the connection: the client as remote, ports in host order), value
 * struct l7_flow. When NetworkPolicy allows a TCP connection into a
 * local pod only through rules with HTTP rules on its port, the tc
 * program that judged its SYN (conntrack.h) marks the flow CT_L7 and
 * writes its entry here: the HTTP sets its requests are judged against,
 * not joined. The server's sock_ops program (l7.c), when the handshake
 * completes, makes the socket's reader state, puts the socket in
 * weir_l7_http and only when both succeeded sets joined. Until then tc
 * drops every packet of the flow that carries bytes toward the server
 * (its handshake passes): a socket that could not join (a full map, a
 * cgroup the L7 programs do not watch, an agent that has not loaded
 * them) never hands the application a byte its reader did not read.
 *
 * The sets are read here on every skb the verdict judges, so a policy
 * change reaches open connections: tc rewrites them when it decides the
 * flow again under a new policy revision; sets all 0 mean the policy no
 * longer restricts the connection (its requests are still read, framed
 * and passed, so a restriction that comes back finds the stream in step).
 *
 * An LRU, so SYNs that never complete cannot fill it for good; an entry
 * evicted from under a live connection fails closed (tc drops its data,
 * the verdict closes it). The socket's close deletes its entry.
 */
#ifndef WEIR_LIB_L7FLOW_H
#define WEIR_LIB_L7FLOW_H

#include "common.h"

#define L7_FLOW_SETS 3

/* L7_SET_TIERED marks a set number whose rules include cluster-tier
 * rules with HTTP rules (conditional rules, internal/policy ClusterHTTP):
 * whether such a rule decides a request depends on its place in the
 * precedence order, which the kernel does not walk per request. A flow
 * naming one is judged in user space, request by request, by the
 * agent's proxy (the policy's own LookupHTTP): the walk hands it over at
 * its first head. The set's rules are not written to the kernel's
 * tables (internal/datapath). */
#define L7_SET_TIERED 0x80000000U

/* l7_sock_key names an accepted socket by its four-tuple, ports in host
 * order, addresses in network order. */
struct l7_sock_key {
	__be32 remote;
	__be32 local;
	__u16 remote_port;
	__u16 local_port;
};

/* l7_skb_key names the socket an sk_skb program's skb is for, as its
 * own socket names the connection (remote_port holds the port in
 * network order in its upper half). */
__always_inline_fn struct l7_sock_key l7_skb_key(const struct __sk_buff *skb)
{
	struct l7_sock_key k = {
		.remote = skb->remote_ip4,
		.local = skb->local_ip4,
		.remote_port = bpf_ntohs((__u16)(skb->remote_port >> 16)),
		.local_port = (__u16)skb->local_port,
	};

	return k;
}

/* l7_flow is what a restricted connection's requests are judged against:
 * a request is allowed when one of the sets allows it (policy unions
 * the HTTP rules of every rule that allows the connection; each of the
 * three lookups of policy.h names at most one set). */
struct l7_flow {
	__u32 sets[L7_FLOW_SETS]; /* HTTP set IDs, 0 for none; all 0: unrestricted */
	__u8 joined;              /* the socket joined weir_l7_http with reader state */
	__u8 pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct l7_sock_key);
	__type(value, struct l7_flow);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_flows SEC(".maps");

/*
 * weir_l7_out: the connections a sender's egress policy restricts to HTTP
 * rules, LRU hash keyed by struct l7_sock_key as the sender's socket
 * names them (the server as remote). tc writes an entry when it allows
 * the SYN (CT_L7_OUT). When the handshake completes, sock_ops puts the
 * client socket in weir_l7_client (lib/l7client.h) and records its
 * cookie and where its stream stands; from then on the socket's message
 * verdict judges what the application sends and moves judged past each
 * byte it lets go. tc at the pod's veth passes the flow's bytes only
 * from that socket and only below judged, so a raw or packet socket in
 * the pod, or TCP sending bytes no verdict saw, gets nothing through.
 */
struct l7_out_flow {
	__u32 sets[L7_FLOW_SETS]; /* as l7_flow's */
	__u32 judged;             /* the sequence number after the last byte judged */
	__u64 cookie;             /* the joined socket's */
	__u8 joined;
	__u8 pad[7];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct l7_sock_key);
	__type(value, struct l7_out_flow);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_out SEC(".maps");

#endif /* WEIR_LIB_L7FLOW_H */

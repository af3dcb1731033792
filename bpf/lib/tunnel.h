/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * tunnel.h: the map of remote pod CIDRs and the way packets reach them.
 *
 * weir_tunnels: LPM trie, key struct tunnel_key = { prefixlen, weir_addr },
 * value struct tunnel_info (the node that owns the CIDR). prefixlen counts
 * the 32 bits of family and padding first, so an IPv4 /24 is stored with
 * prefixlen 32 + 24 and can never match an IPv6 address.
 *
 * weir_peer_nodes: hash, key struct weir_addr (a peer node's underlay
 * address), value __u32 (reserved). Only these may send into the overlay.
 *
 * The VXLAN network identifier carries the sender's security identity, as
 * Cilium's does: the receiving node judges a new pod by the identity its
 * own node vouches for, from the first packet, instead of waiting for the
 * pod's address to reach it through the API server. A pod address is
 * accepted from the overlay only from the node that owns its CIDR. Native
 * routing carries the identity in an IPv4 option instead (nativeid.h).
 */
#ifndef WEIR_LIB_TUNNEL_H
#define WEIR_LIB_TUNNEL_H

#include "addr.h"
#include "eth.h"
#include "metrics.h"
#include "nativeid.h"

#define TUNNEL_KEY_PREFIX_BITS 32 /* family + pad in front of the address */

struct tunnel_key {
	__u32 prefixlen;
	struct weir_addr dst;
};

struct tunnel_info {
	struct weir_addr node; /* underlay address of the owning node */
	__u32 flags;           /* reserved */
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 16384);
	__type(key, struct tunnel_key);
	__type(value, struct tunnel_info);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_tunnels SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct weir_addr);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_peer_nodes SEC(".maps");

__always_inline_fn struct tunnel_info *tunnel_lookup_v4(__be32 ip)
{
	struct tunnel_key key = { .prefixlen = TUNNEL_KEY_PREFIX_BITS + 32 };

	weir_addr_from_v4(&key.dst, ip);
	return bpf_map_lookup_elem(&weir_tunnels, &key);
}

/* tunnel_peer_node_v4 reports whether ip (network order) is a peer node's. */
__always_inline_fn int tunnel_peer_node_v4(__be32 ip)
{
	struct weir_addr key;

	weir_addr_from_v4(&key, ip);
	return bpf_map_lookup_elem(&weir_peer_nodes, &key) != NULL;
}

/* tunnel_owner_is reports whether the tunnel entry t names node (network order). */
__always_inline_fn int tunnel_owner_is(const struct tunnel_info *t, __be32 node)
{
	__be32 owner;

	if (t->node.family != WEIR_AF_INET)
		return 0;
	__builtin_memcpy(&owner, t->node.addr, sizeof(owner));
	return owner == node;
}

/*
 * tunnel_set_key attaches VXLAN metadata for the node that owns the
 * destination, with the sender's identity as the network identifier; the
 * collect-metadata VXLAN device encapsulates with it.
 */
__always_inline_fn int tunnel_set_key(struct __sk_buff *skb, const struct tunnel_info *t, __u32 src_id)
{
	struct bpf_tunnel_key key = {};
	__u32 remote;

	if (t->node.family != WEIR_AF_INET)
		return -1;
	__builtin_memcpy(&remote, t->node.addr, sizeof(remote));
	key.remote_ipv4 = bpf_ntohl(remote);
	key.tunnel_id = src_id & 0xffffff;
	key.tunnel_ttl = 64;
	return bpf_skb_set_tunnel_key(skb, &key, sizeof(key), BPF_F_ZERO_CSUM_TX);
}

/*
 * native_fib_v4 asks the FIB for the route the agent installed towards a
 * remote CIDR, for a packet of tot_len bytes; an unresolved neighbour is
 * fine, redirect_neigh resolves it.
 */
__always_inline_fn long native_fib_v4(struct __sk_buff *skb, struct bpf_fib_lookup *fib, __be32 saddr, __be32 daddr,
				      __u8 tos, __u8 proto, __u16 tot_len)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = WEIR_AF_INET;
	fib->ipv4_src = saddr;
	fib->ipv4_dst = daddr;
	fib->tos = tos;
	fib->l4_protocol = proto;
	fib->tot_len = tot_len;
	fib->ifindex = skb->ingress_ifindex;
	return bpf_fib_lookup(skb, fib, sizeof(*fib), 0);
}

/*
 * native_forward_v4 routes a packet for a remote pod through the FIB and
 * puts the sender's identity into it when it opens a flow and the route's
 * MTU leaves room (nativeid.h).
 */
__always_inline_fn int native_forward_v4(struct __sk_buff *skb, struct iphdr *ip, __u32 src_id, int opens)
{
	struct bpf_fib_lookup fib;
	__be32 saddr = ip->saddr, daddr = ip->daddr;
	__u16 tot_len = bpf_ntohs(ip->tot_len);
	__u8 tos = ip->tos, proto = ip->protocol;
	int stamp = nativeid_wanted(skb, ip, sizeof(struct ethhdr), opens);
	long rc;

	rc = native_fib_v4(skb, &fib, saddr, daddr, tos, proto, tot_len + (stamp ? IPOPT_WEIR_IDENTITY_LEN : 0));
	if (stamp && rc == BPF_FIB_LKUP_RET_FRAG_NEEDED) {
		stamp = 0; /* no room under the MTU: the receiver's ipcache judges it */
		rc = native_fib_v4(skb, &fib, saddr, daddr, tos, proto, tot_len);
	}
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH) {
		metric_inc(METRIC_PASS_HOST);
		return TC_ACT_OK;
	}
	if (stamp) {
		/* Without room the packet goes as it came: judged by the
		 * receiver's ipcache. Half made, it goes nowhere. */
		rc = nativeid_stamp(skb, sizeof(struct ethhdr), src_id);
		if (rc == -2) {
			metric_inc(METRIC_DROP_IDENTITY_OPTION);
			return TC_ACT_SHOT;
		}
		if (rc == 0)
			metric_inc(METRIC_IDENTITY_OPTION_SENT);
	}
	{
		struct bpf_redir_neigh nh = { .nh_family = fib.family };

		nh.ipv4_nh = fib.ipv4_dst;
		metric_inc(METRIC_REDIRECT_NATIVE);
		return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
	}
}

/*
 * tunnel_forward_v4 sends a packet for a remote pod to the node that owns
 * it; src_id is the sender's identity, carried in the VNI in VXLAN mode
 * and in an IPv4 option on flow-opening packets in native routing (opens:
 * the packet was allowed as the first of a new flow).
 */
__always_inline_fn int tunnel_forward_v4(struct __sk_buff *skb, struct iphdr *ip,
					 const struct tunnel_info *t, __u32 src_id, int opens)
{
	if (TUNNEL_MODE == WEIR_MODE_VXLAN) {
		if (tunnel_set_key(skb, t, src_id) < 0) {
			metric_inc(METRIC_DROP_TUNNEL);
			return TC_ACT_SHOT;
		}
		metric_inc(METRIC_REDIRECT_TUNNEL);
		return bpf_redirect(OVERLAY_IFINDEX, 0);
	}
	return native_forward_v4(skb, ip, src_id, opens);
}

#endif /* WEIR_LIB_TUNNEL_H */

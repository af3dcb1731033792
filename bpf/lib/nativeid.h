/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * nativeid.h: the sender's identity in an IPv4 option, for native routing.
 *
 * VXLAN carries the sending pod's identity in the VNI (tunnel.h); a natively
 * routed packet has no such field, so a node whose ipcache has not learned
 * a new pod's address yet would judge its first packets unidentified and
 * drop them wherever a policy applies: TCP waits a second for the SYN's
 * retransmission. The sending node therefore puts the identity into the
 * packets that open a flow, as a 4-byte IPv4 option right after the fixed
 * header:
 *
 *   type 0x9e (RFC 4727's experimental option, copied flag set), length 4,
 *   identity (16 bits, network order)
 *
 * Only the packet this node's conntrack allowed as the first of a new flow
 * carries it (for TCP, the first SYN; a first fragment, if fragmented).
 * The receiver tracks the flow from that packet. A retransmission goes
 * without and is judged by the receiver's ipcache, which has usually
 * learned the address by then: should an underlay drop packets with IPv4
 * options, connections still open, a retransmission later, and the agent
 * can turn the option off (--identity-option=false).
 * Established flows keep the fixed header, so receive offload (GRO, which
 * refuses IPv4 options) still coalesces bulk traffic and UDP pays nothing
 * per datagram. A packet that would outgrow the route's MTU, a GSO packet, or
 * one whose header has no room goes without it and is judged by the
 * receiver's ipcache, as before: unidentified while the address is new.
 *
 * The receiving node trusts the option only as the first option of a
 * packet whose pod source came from the hop towards the node that owns the
 * source's CIDR (host.c), and strips it before anything else reads the
 * packet. A pod cannot forge it: from_container drops every packet whose
 * first option is this one (the sender adds its own in front of any other
 * option, so a pod's option can never come first on the wire).
 */
#ifndef WEIR_LIB_NATIVEID_H
#define WEIR_LIB_NATIVEID_H

#include "common.h"

#define IPOPT_WEIR_IDENTITY 0x9e
#define IPOPT_WEIR_IDENTITY_LEN 4
#define IPV4_MAX_IHL 15

#define IPV4_FRAG_OFFSET_MASK 0x1fff

struct ipopt_identity {
	__u8 type;
	__u8 len;
	__be16 id;
};

/* nativeid_first_option reads the type of the first IPv4 option at l3_off;
 * 0 when the header has none. */
__always_inline_fn __u8 nativeid_first_option(struct __sk_buff *skb, const struct iphdr *ip, __u32 l3_off)
{
	__u8 type;

	if ((ip->ihl & 0xf) <= 5)
		return 0;
	if (bpf_skb_load_bytes(skb, l3_off + sizeof(struct iphdr), &type, 1) < 0)
		return 0;
	return type;
}

/* nativeid_forged reports whether a pod's packet carries the identity
 * option first, where a receiving node would read it as its node's word. */
__always_inline_fn int nativeid_forged(struct __sk_buff *skb, const struct iphdr *ip, __u32 l3_off)
{
	return nativeid_first_option(skb, ip, l3_off) == IPOPT_WEIR_IDENTITY;
}

/* nativeid_wanted reports whether the packet opens a flow the receiver may
 * not be able to identify from its ipcache, and can take the option; opens:
 * this node's conntrack allowed it as the first of a new flow. */
__always_inline_fn int nativeid_wanted(struct __sk_buff *skb, const struct iphdr *ip, __u32 l3_off, int opens)
{
	__u8 flags;

	if (!SEND_IDENTITY_OPTION || !opens)
		return 0;
	if (skb->gso_size || (ip->ihl & 0xf) >= IPV4_MAX_IHL)
		return 0;
	if (bpf_ntohs(ip->tot_len) > 0xffff - IPOPT_WEIR_IDENTITY_LEN)
		return 0; /* no room in the length field */
	if (ip->frag_off & bpf_htons(IPV4_FRAG_OFFSET_MASK))
		return 0; /* a later fragment follows its first (frag.h) */
	if (ip->protocol != IPPROTO_TCP)
		return 1;
	/* The TCP flags byte: SYN (0x02) without ACK (0x10). */
	if (bpf_skb_load_bytes(skb, l3_off + (ip->ihl & 0xf) * 4 + 13, &flags, 1) < 0)
		return 0;
	return (flags & 0x12) == 0x02;
}

/* nativeid_fix_header adjusts version/IHL and total length by delta words
 * and keeps the header checksum right: the option's own bytes enter or
 * leave the sum as opt (0 when none). */
__always_inline_fn int nativeid_fix_header(struct __sk_buff *skb, __u32 l3_off, int delta, __u32 opt_in, __u32 opt_out)
{
	__u32 csum_off = l3_off + offsetof(struct iphdr, check);
	__be16 old_word, new_word, old_len, new_len;
	__u8 vihl;

	if (bpf_skb_load_bytes(skb, l3_off, &old_word, sizeof(old_word)) < 0 ||
	    bpf_skb_load_bytes(skb, l3_off + offsetof(struct iphdr, tot_len), &old_len, sizeof(old_len)) < 0)
		return -1;
	vihl = *(__u8 *)&old_word;
	vihl = (vihl & 0xf0) | (((vihl & 0xf) + delta) & 0xf);
	new_word = old_word;
	*(__u8 *)&new_word = vihl;
	new_len = bpf_htons(bpf_ntohs(old_len) + delta * 4);
	if (bpf_skb_store_bytes(skb, l3_off, &new_word, sizeof(new_word), 0) < 0 ||
	    bpf_skb_store_bytes(skb, l3_off + offsetof(struct iphdr, tot_len), &new_len, sizeof(new_len), 0) < 0)
		return -1;
	if (bpf_l3_csum_replace(skb, csum_off, old_word, new_word, sizeof(new_word)) < 0 ||
	    bpf_l3_csum_replace(skb, csum_off, old_len, new_len, sizeof(new_len)) < 0 ||
	    bpf_l3_csum_replace(skb, csum_off, opt_out, opt_in, sizeof(opt_in)) < 0)
		return -1;
	return 0;
}

/* nativeid_stamp puts id into the packet at l3_off as its first option. It
 * returns -1 when no room could be made (the packet is unchanged), -2 when
 * the packet was left half made. Pointers into the packet are invalid
 * afterwards. */
__always_inline_fn int nativeid_stamp(struct __sk_buff *skb, __u32 l3_off, __u32 id)
{
	struct ipopt_identity opt = {
		.type = IPOPT_WEIR_IDENTITY,
		.len = IPOPT_WEIR_IDENTITY_LEN,
		.id = bpf_htons(id),
	};
	__u32 raw;

	/* BPF_ADJ_ROOM_NET opens the room right behind the 20-byte header. */
	if (bpf_skb_adjust_room(skb, sizeof(opt), BPF_ADJ_ROOM_NET, 0) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, l3_off + sizeof(struct iphdr), &opt, sizeof(opt), 0) < 0)
		return -2;
	__builtin_memcpy(&raw, &opt, sizeof(raw));
	return nativeid_fix_header(skb, l3_off, 1, raw, 0) < 0 ? -2 : 0;
}

/*
 * nativeid_take reads and strips the identity option of a packet at l3_off
 * whose sender was checked to be the node that owns its pod source. It
 * sets *id to the identity carried (0 when the packet carries none; the
 * caller checks it is one a pod can have) and returns -1 when the option
 * could not be stripped. Pointers into the packet are invalid afterwards.
 */
__always_inline_fn int nativeid_take(struct __sk_buff *skb, const struct iphdr *ip, __u32 l3_off, __u32 *id)
{
	struct ipopt_identity opt;
	__u32 raw;

	*id = 0;
	if ((ip->ihl & 0xf) <= 5)
		return 0;
	if (bpf_skb_load_bytes(skb, l3_off + sizeof(struct iphdr), &opt, sizeof(opt)) < 0)
		return 0;
	if (opt.type != IPOPT_WEIR_IDENTITY)
		return 0;
	if (opt.len != IPOPT_WEIR_IDENTITY_LEN)
		return -1;
	__builtin_memcpy(&raw, &opt, sizeof(raw));
	if (bpf_skb_adjust_room(skb, -(__s32)sizeof(opt), BPF_ADJ_ROOM_NET, 0) < 0)
		return -1;
	if (nativeid_fix_header(skb, l3_off, -1, 0, raw) < 0)
		return -1;
	/* With CHECKSUM_COMPLETE the kernel took the option's bytes out of
	 * skb->csum, but the header's sum is what it was (its checksum
	 * field absorbed the change): put them back, or the stack reports a
	 * checksum fault. Other checksum states refuse the update. */
	bpf_csum_update(skb, bpf_csum_diff(NULL, 0, &raw, sizeof(raw), 0));
	*id = bpf_ntohs(opt.id);
	return 0;
}

#endif /* WEIR_LIB_NATIVEID_H */

/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * addr.h: the address representation used in every map key.
 *
 * Keys carry the family and a 16-byte address so IPv4 and IPv6 share one
 * map layout: an IPv4 address sits in the first four bytes and the rest is
 * zero. No map or API assumes a family, so dual-stack adds entries, not maps.
 */
#ifndef WEIR_LIB_ADDR_H
#define WEIR_LIB_ADDR_H

#include "common.h"

struct weir_addr {
	__u8 family; /* WEIR_AF_INET or WEIR_AF_INET6 */
	__u8 pad[3];
	__u8 addr[16];
};

__always_inline_fn void weir_addr_from_v4(struct weir_addr *a, __be32 ip)
{
	__builtin_memset(a, 0, sizeof(*a));
	a->family = WEIR_AF_INET;
	__builtin_memcpy(a->addr, &ip, sizeof(ip));
}

#endif /* WEIR_LIB_ADDR_H */

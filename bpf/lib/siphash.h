/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * siphash.h: SipHash-2-4 fed one byte at a time.
 *
 * The HTTP reader (http.h) keeps hashes of what rules match on, not the
 * bytes, and the rules reach the kernel as the same hashes. Unkeyed, a
 * path whose hash equals an allowed one's could be computed offline; a
 * keyed hash (the node's secret, never seen by a pod) cannot be. The
 * state is fed a byte at a time because a head may arrive in any number
 * of skbs; sip_final of a copy gives the hash of what was fed so far (a
 * path's prefixes). internal/l7's sipState is the same function in Go.
 */
#ifndef WEIR_LIB_SIPHASH_H
#define WEIR_LIB_SIPHASH_H

#include "common.h"

struct sip {
	__u64 v0, v1, v2, v3;
	__u64 m; /* the word being filled, little-endian */
	__u8 n;  /* bytes fed, modulo 256 (the length SipHash finalises with) */
	__u8 pad[7];
};

#define SIP_ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))

#define SIP_ROUND(v0, v1, v2, v3)                                            \
	do {                                                                 \
		v0 += v1;                                                    \
		v1 = SIP_ROTL(v1, 13);                                       \
		v1 ^= v0;                                                    \
		v0 = SIP_ROTL(v0, 32);                                       \
		v2 += v3;                                                    \
		v3 = SIP_ROTL(v3, 16);                                       \
		v3 ^= v2;                                                    \
		v0 += v3;                                                    \
		v3 = SIP_ROTL(v3, 21);                                       \
		v3 ^= v0;                                                    \
		v2 += v1;                                                    \
		v1 = SIP_ROTL(v1, 17);                                       \
		v1 ^= v2;                                                    \
		v2 = SIP_ROTL(v2, 32);                                       \
	} while (0)

/* sip_init starts a hash under the key (k0, k1). */
__always_inline_fn void sip_init(struct sip *s, __u64 k0, __u64 k1)
{
	s->v0 = k0 ^ 0x736f6d6570736575ULL;
	s->v1 = k1 ^ 0x646f72616e646f6dULL;
	s->v2 = k0 ^ 0x6c7967656e657261ULL;
	s->v3 = k1 ^ 0x7465646279746573ULL;
	s->m = 0;
	s->n = 0;
}

/* sip_byte feeds one byte: every eighth completes a word, compressed
 * with two rounds. */
__always_inline_fn void sip_byte(struct sip *s, __u8 c)
{
	__u64 v0, v1, v2, v3;

	s->m |= (__u64)c << ((s->n & 7) * 8);
	s->n++;
	if (s->n & 7)
		return;
	v0 = s->v0;
	v1 = s->v1;
	v2 = s->v2;
	v3 = s->v3 ^ s->m;
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	s->v0 = v0 ^ s->m;
	s->v1 = v1;
	s->v2 = v2;
	s->v3 = v3;
	s->m = 0;
}

/* sip_final is the hash of what was fed; s is left as it was. */
__always_inline_fn __u64 sip_final(const struct sip *s)
{
	__u64 b = ((__u64)s->n << 56) | s->m;
	__u64 v0 = s->v0, v1 = s->v1, v2 = s->v2, v3 = s->v3 ^ b;

	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	v0 ^= b;
	v2 ^= 0xff;
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	SIP_ROUND(v0, v1, v2, v3);
	return v0 ^ v1 ^ v2 ^ v3;
}

#endif /* WEIR_LIB_SIPHASH_H */

/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * l7match.h: HTTP rules as hash lookups (internal/l7's KernelRules).
 *
 * A set of up to 64 HTTP rules (one port's, for one peer) is a row of
 * weir_l7_sets and the entries of weir_l7_match that name it. Each
 * condition of each rule is an entry: the hash of a method, a canonical
 * path, a PathPrefix value, a host or the labels after a "*.", whose
 * value is the mask of the rules it satisfies. A request, read by
 * lib/http.h into the same hashes, makes one lookup per hash it has (its
 * method, its path, each of its path prefixes, its host and each of its
 * suffixes) and ANDs the three masks: the cost is the same at 1 rule as
 * at 64. Header conditions are per name: the row lists the set's header
 * names (at most L7_SET_HEADERS), with the rules that name each and
 * those any value meets (Present); an Exact value is a lookup of the
 * name's and the value's hash. A rule whose header is missing, or whose
 * value no lookup matches, is out; a head that repeats a header the set
 * names is refused, as the Go matcher refuses it. Path regular
 * expressions are the set's automaton (l7dfa.h): the rules it judges,
 * path_re, are met by the mask of the row the head's path reached. Rules
 * with a condition the kernel does not judge (a header's regular
 * expression, a path's the automaton could not hold) are marked
 * user_space: a request only they may match goes to user space.
 */
#ifndef WEIR_LIB_L7MATCH_H
#define WEIR_LIB_L7MATCH_H

#include "common.h"
#include "http.h"

/* What a lookup hashes (l7.KernelKeyKind). */
enum {
	L7_KEY_METHOD = 1,
	L7_KEY_PATH_EXACT,
	L7_KEY_PATH_PREFIX,
	L7_KEY_HOST_EXACT,
	L7_KEY_HOST_SUFFIX,
	L7_KEY_HEADER_EXACT, /* l7_header_key of a name and a value */
};

/* The most header names one set's rules may match on. */
#define L7_SET_HEADERS 8

/* The verdicts (l7.KernelVerdict). */
enum {
	L7_DENY,
	L7_ALLOW,
	L7_USER_SPACE,
	L7_REFUSE, /* a header the set names came twice: 400 */
};

struct l7_match_key {
	__u32 set;
	__u8 kind;
	__u8 pad[3];
	__u64 hash;
};

struct l7_set {
	__u64 any_method;
	__u64 any_path;
	__u64 any_host;
	__u64 needs_path;
	__u64 user_space;
	/* Header conditions: header_rules are the rules with one; for each
	 * of the set's names, hname its hash, hneed the rules that name it
	 * and hany those any value meets. */
	__u64 header_rules;
	__u64 hname[L7_SET_HEADERS];
	__u64 hneed[L7_SET_HEADERS];
	__u64 hany[L7_SET_HEADERS];
	__u32 nheaders;
	/* The path automaton: the rules it judges, and its rows
	 * (dfa_base, the first, is where a path starts; none when
	 * dfa_rows is 0, and then no path meets path_re). */
	__u32 dfa_base;
	__u64 path_re;
	__u32 dfa_rows;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct l7_match_key);
	__type(value, __u64);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_match SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct l7_set);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_sets SEC(".maps");

__always_inline_fn __u64 l7_lookup(__u32 set, __u8 kind, __u64 hash)
{
	struct l7_match_key key = { .set = set, .kind = kind, .hash = hash };
	__u64 *mask = bpf_map_lookup_elem(&weir_l7_match, &key);

	return mask ? *mask : 0;
}

/* l7_method_hash hashes the method the reader kept, under its key. */
__always_inline_fn __u64 l7_method_hash(struct http_state *s)
{
	struct sip h;
	int i;

	sip_init(&h, HTTP_HASH_KEY0, HTTP_HASH_KEY1);
	for (i = 0; i < HTTP_MAX_METHOD; i++) {
		if (i >= s->method_len)
			break;
		sip_byte(&h, s->method[i]);
	}
	return sip_final(&h);
}

/* l7_lowest_rule is the index of the lowest bit of a non-zero mask:
 * the rule a request's record names (rules are numbered in the order
 * the set lists them, so it is the first that allowed). */
__always_inline_fn __u8 l7_lowest_rule(__u64 mask)
{
	__u8 i = 0;

	mask &= -mask;
	if (mask & 0xffffffff00000000ULL)
		i += 32;
	if (mask & 0xffff0000ffff0000ULL)
		i += 16;
	if (mask & 0xff00ff00ff00ff00ULL)
		i += 8;
	if (mask & 0xf0f0f0f0f0f0f0f0ULL)
		i += 4;
	if (mask & 0xccccccccccccccccULL)
		i += 2;
	if (mask & 0xaaaaaaaaaaaaaaaaULL)
		i += 1;
	return i;
}

/* l7_header_key is the lookup hash of a header's name and value: for a
 * given name, a different value is a different key. */
__always_inline_fn __u64 l7_header_key(__u64 name, __u64 value)
{
	return (name * FNV_PRIME) ^ value;
}

/* l7_header_slot is the head's slot of the watched name h, -1 if the
 * head does not carry it. */
__always_inline_fn int l7_header_slot(struct http_state *s, __u64 h)
{
	int j;

	for (j = 0; j < HTTP_MAX_HEADERS; j++) {
		if (j >= s->hdr_seen)
			break;
		if (s->hdr_name[j] == h)
			return j;
	}
	return -1;
}

/* l7_header_misses returns the rules of the set whose header conditions
 * the head does not meet, or sets *refuse when it repeats a header the
 * set names. */
__always_inline_fn __u64 l7_header_misses(__u32 set_id, struct l7_set *set, struct http_state *s, int *refuse)
{
	__u64 miss = 0, met;
	int k, j;

	for (k = 0; k < L7_SET_HEADERS; k++) {
		if (k >= set->nheaders)
			break;
		j = l7_header_slot(s, set->hname[k]);
		if (j < 0) {
			miss |= set->hneed[k];
			continue;
		}
		if (s->hdr_dup & (1 << j)) {
			*refuse = 1;
			return 0;
		}
		met = set->hany[k] |
		      l7_lookup(set_id, L7_KEY_HEADER_EXACT,
				l7_header_key(set->hname[k], s->hdr_val[j & (HTTP_MAX_HEADERS - 1)]));
		miss |= set->hneed[k] & ~met;
	}
	return miss;
}

/* l7_dfa_prepare tells the reader, before it reads an skb, where the
 * path automata of the flow's sets start (http_dfa_begin takes them up
 * where a path begins): one lookup per set, per skb. */
__always_inline_fn void l7_dfa_prepare(struct http_state *s, const __u32 *sets)
{
	struct l7_set *set;
	__u32 id;
	int i;

	for (i = 0; i < HTTP_DFA_SETS; i++) {
		id = sets[i];
		s->dfa_next_set[i] = 0;
		s->dfa_start[i] = 0;
		if (!id)
			continue;
		/* A set not there yet is read for no set: should it appear
		 * before the judge, its expressions go to user space. */
		set = bpf_map_lookup_elem(&weir_l7_sets, &id);
		if (!set)
			continue;
		s->dfa_next_set[i] = id;
		if (set->dfa_rows)
			s->dfa_start[i] = set->dfa_base;
	}
}

/* L7_DFA_UNREAD: no automaton of the set was stepped over this head. */
#define L7_DFA_UNREAD (~0ULL)

/* l7_dfa_path is the accept mask of the row set_id's automaton reached
 * over the head's path, or L7_DFA_UNREAD when it was not begun for that
 * set (the flow's sets changed in the middle of the head). Global (see
 * http_dfa_step). */
__attribute__((noinline)) __u64 l7_dfa_path(struct http_state *s, __u32 set_id)
{
	int i;

	if (!s)
		return L7_DFA_UNREAD;
	for (i = 0; i < HTTP_DFA_SETS; i++) {
		if (s->dfa_set[i] == set_id)
			return l7_dfa_accept(s->dfa_row[i]);
	}
	return L7_DFA_UNREAD;
}

/* l7_judge decides the head the reader just finished against a set;
 * when it allows, *rule is the allowing rule's index in the set. */
__always_inline_fn int l7_judge(__u32 set_id, struct http_state *s, __u8 *rule)
{
	struct l7_set *set = bpf_map_lookup_elem(&weir_l7_sets, &set_id);
	__u64 method, path, host, candidates, h, user_space;
	int i;

	if (!set)
		return L7_DENY; /* not written (yet): closed */
	user_space = set->user_space;
	method = set->any_method | l7_lookup(set_id, L7_KEY_METHOD, l7_method_hash(s));
	if (s->flags & HTTP_FLAG_NO_PATH) {
		path = set->any_path & ~set->needs_path;
	} else {
		path = set->any_path | l7_lookup(set_id, L7_KEY_PATH_EXACT, s->path_hash) |
		       l7_lookup(set_id, L7_KEY_PATH_PREFIX, s->path_hash);
		for (i = 0; i < HTTP_MAX_PREFIXES; i++) {
			if (i >= s->prefixes)
				break;
			path |= l7_lookup(set_id, L7_KEY_PATH_PREFIX, s->prefix[i]);
		}
		if (set->path_re) {
			h = l7_dfa_path(s, set_id);
			/* Not read for this set: what only its expressions
			 * could allow goes to user space, never allowed
			 * unread. (A path every one of 64 expressions matches
			 * reads as unread too: user space judges it.) */
			if (h == L7_DFA_UNREAD)
				user_space |= set->path_re;
			path |= h & set->path_re;
		}
	}
	host = set->any_host;
	/* Fold the labels from the right: after label i the hash is that of
	 * labels i..n-1, the whole host at i == 0, a suffix before. */
	h = FNV_OFFSET;
	for (i = HTTP_MAX_LABELS - 1; i >= 0; i--) {
		if (i >= s->labels)
			continue;
		h = (h ^ s->label[i]) * FNV_PRIME;
		host |= l7_lookup(set_id, i ? L7_KEY_HOST_SUFFIX : L7_KEY_HOST_EXACT, h);
	}
	candidates = method & path & host;
	if (set->header_rules) {
		int refuse = 0;

		candidates &= ~l7_header_misses(set_id, set, s, &refuse);
		if (refuse)
			return L7_REFUSE;
	}
	if (candidates & ~user_space) {
		*rule = l7_lowest_rule(candidates & ~user_space);
		return L7_ALLOW;
	}
	if (candidates)
		return L7_USER_SPACE;
	return L7_DENY;
}

#endif /* WEIR_LIB_L7MATCH_H */

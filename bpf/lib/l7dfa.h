/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * l7dfa.h: path regular expressions as automata (internal/l7's DFA).
 *
 * A set's path regular expressions are one deterministic automaton over
 * ASCII, built in Go from Go's own compiled programs, so it answers as
 * the user-space matcher does. Its states are rows of weir_l7_dfa, each
 * the next row for every byte and the mask of the rules whose expressions
 * match a path ending there. A set's rows are a run of the array its row
 * in weir_l7_sets names (dfa_base, dfa_rows); transitions hold absolute
 * row numbers, and row 0 is dead: never written, all zeros, it goes
 * nowhere and matches nothing.
 *
 * The reader steps the automata of the flow's sets (at most
 * HTTP_DFA_SETS) with each canonical path byte it hashes (http_path_out),
 * so they read exactly the string the path's hash covers. Where a head
 * begins, the walker starts them at their sets' first rows
 * (l7_dfa_begin, l7match.h); at the head's end the judge reads the
 * accept mask of the row each reached.
 */
#ifndef WEIR_LIB_L7DFA_H
#define WEIR_LIB_L7DFA_H

#include "common.h"

/* The alphabet: canonical paths are ASCII (l7.DFAColumns). */
#define L7_DFA_COLS 128

/* Rows for every set's automaton on the node; a set holds at most 1,024
 * (l7.DefaultDFALimits). */
#define L7_DFA_ROWS 16384

/* The automata a reader steps: one per set of its flow (L7_FLOW_SETS). */
#define HTTP_DFA_SETS 3

struct l7_dfa_row {
	__u16 next[L7_DFA_COLS]; /* the row after each byte; 0: dead */
	__u64 accept;            /* rules matched by a path ending here */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, L7_DFA_ROWS);
	__type(key, __u32);
	__type(value, struct l7_dfa_row);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_dfa SEC(".maps");

/* l7_dfa_accept is the accept mask of row (0 for the dead row). */
__always_inline_fn __u64 l7_dfa_accept(__u16 row)
{
	__u32 key = row;
	struct l7_dfa_row *r;

	if (!row)
		return 0;
	r = bpf_map_lookup_elem(&weir_l7_dfa, &key);
	return r ? r->accept : 0;
}

#endif /* WEIR_LIB_L7DFA_H */

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * tests/http_reader.c: lib/http.h under BPF_PROG_RUN.
 *
 * A tc program that reads its packet's payload (after a 14-byte Ethernet
 * header the test prepends) as the next bytes of one connection's stream,
 * with the reader's state kept in weir_http_test_state between runs, and
 * writes a record for every head it finishes, and for a refusal or punt,
 * to weir_http_test_out. The Go test feeds streams cut into runs and holds
 * the records to internal/l7's parser (internal/datapath's
 * http_reader_linux_test.go). Only tests load it.
 */
#include "../lib/common.h"
#include "../lib/http.h"
#include "../lib/l7match.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#define TEST_MAX_BYTES 4096
#define TEST_MAX_RECORDS 64

enum {
	REC_HEAD = 1,
	REC_ERROR,
	REC_PUNT,
};

struct http_test_record {
	__u64 start;      /* head: its first byte; error, punt: Framed */
	__u64 content_length;
	__u64 path_hash;
	__u64 prefix[HTTP_MAX_PREFIXES];
	__u64 label[HTTP_MAX_LABELS];
	__u32 head_len;
	__u8 kind;
	__u8 error;
	__u8 flags;
	__u8 method_len;
	__u8 method[HTTP_MAX_METHOD];
	__u8 prefixes;
	__u8 labels;
	__u8 verdict; /* l7_judge's against TEST_SET, when set */
	__u8 rule;    /* and the rule that allowed */
	__u16 host_at; /* where the Host name begins in the head */
	__u8 host_len;
	__u8 hdr_seen; /* watched header fields kept */
	__u16 hdr_dup;
	__u8 pad[6];
	__u64 hdr_name[HTTP_MAX_HEADERS];
	__u64 hdr_val[HTTP_MAX_HEADERS];
};

/* The weir_l7_sets row the test judges each head against; 0 for none. */
volatile const __u32 TEST_SET = 0;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct http_state);
} weir_http_test_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TEST_MAX_RECORDS);
	__type(key, __u32);
	__type(value, struct http_test_record);
} weir_http_test_out SEC(".maps");

/* weir_http_test_count[0] is the number of records written. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} weir_http_test_count SEC(".maps");

struct scratch {
	__u8 buf[TEST_MAX_BYTES];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} weir_http_test_scratch SEC(".maps");

struct feed {
	struct http_state *s;
	struct scratch *b;
	__u32 pos, len;
};

static void record(struct http_state *s, __u8 kind)
{
	__u32 zero = 0, *n = bpf_map_lookup_elem(&weir_http_test_count, &zero);
	struct http_test_record *r;
	__u32 i;

	if (!n)
		return;
	i = *n;
	r = bpf_map_lookup_elem(&weir_http_test_out, &i);
	if (!r)
		return;
	__builtin_memset(r, 0, sizeof(*r));
	r->kind = kind;
	r->error = s->error;
	if (kind == REC_HEAD) {
		r->start = s->head_start;
		r->head_len = s->head_len;
		r->content_length = s->content_length;
		r->flags = s->flags;
		r->path_hash = s->path_hash;
		r->prefixes = s->prefixes;
		r->labels = s->labels;
		r->method_len = s->method_len;
		__builtin_memcpy(r->method, s->method, sizeof(r->method));
		__builtin_memcpy(r->prefix, s->prefix, sizeof(r->prefix));
		__builtin_memcpy(r->label, s->label, sizeof(r->label));
		r->host_at = s->host_at;
		r->host_len = s->host_len;
		r->hdr_seen = s->hdr_seen;
		r->hdr_dup = s->hdr_dup;
		__builtin_memcpy(r->hdr_name, s->hdr_name, sizeof(r->hdr_name));
		__builtin_memcpy(r->hdr_val, s->hdr_val, sizeof(r->hdr_val));
		if (TEST_SET)
			r->verdict = l7_judge(TEST_SET, s, &r->rule);
	} else {
		r->start = s->unit_start;
	}
	*n = i + 1;
}

static long step(__u32 i, void *data)
{
	struct feed *f = data;
	struct http_state *s = f->s;
	__u32 n;
	long r;
	__u8 c;

	if (f->pos >= f->len)
		return 1;
	if (s->state == HS_BODY || s->state == HS_CHUNK_DATA) {
		f->pos += http_skip(s, f->len - f->pos);
		return 0;
	}
	/* The same runs l7http.h takes, so the comparison covers them. */
	n = http_take_value_run(s, f->b->buf, f->pos, TEST_MAX_BYTES - 1, f->len - f->pos);
	if (n) {
		f->pos += n;
		return 0;
	}
	c = f->b->buf[f->pos & (TEST_MAX_BYTES - 1)];
	r = http_feed_byte(s, c);
	f->pos++;
	switch (r) {
	case HTTP_HEAD_DONE:
		record(s, REC_HEAD);
		return 0;
	case HTTP_ERROR:
		record(s, REC_ERROR);
		return 1;
	case HTTP_PUNT:
		record(s, REC_PUNT);
		return 1;
	}
	return 0;
}

SEC("tc")
int http_reader_test(struct __sk_buff *skb)
{
	__u32 zero = 0, len = skb->len > ETH_HLEN ? skb->len - ETH_HLEN : 0;
	struct feed f = {};

	f.s = bpf_map_lookup_elem(&weir_http_test_state, &zero);
	f.b = bpf_map_lookup_elem(&weir_http_test_scratch, &zero);
	if (!f.s || !f.b || len > TEST_MAX_BYTES)
		return TC_ACT_SHOT;
	if (f.s->state == HS_FAILED)
		return TC_ACT_OK;
	if (len == 0)
		return TC_ACT_OK;
	/* Keep clang from folding the bounds into a form the verifier
	 * cannot follow. */
	asm volatile("" : "+r"(len));
	if (len < 1 || len > TEST_MAX_BYTES)
		return TC_ACT_SHOT;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, f.b->buf, len))
		return TC_ACT_SHOT;
	f.len = len;
	{
		__u32 sets[HTTP_DFA_SETS] = { TEST_SET };

		l7_dfa_prepare(f.s, sets);
	}
	bpf_loop(2 * TEST_MAX_BYTES, step, &f, 0);
	return TC_ACT_OK;
}

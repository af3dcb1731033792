/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * http.h: the in-kernel HTTP/1.1 request reader.
 *
 * It frames a connection's inbound stream exactly as internal/l7's Parser
 * does (the Go parser is the reference, and a differential fuzz test holds
 * this one to it): heads, Content-Length bodies, chunked bodies with their
 * extensions and trailers, and the next request after each. Whatever the
 * Go parser refuses, it refuses, with the same Framed offset (the first
 * byte that belongs to no accepted request). Of each head it keeps what
 * rules match on, as hashes, never the bytes: the method, the canonical
 * path's hash and the hashes of its prefixes at element boundaries (for
 * PathPrefix), and the host's label hashes (for exact and "*."
 * hostnames), and of the header fields some rule names (the node's
 * watch list, weir_l7_header_watch) the name's and the value's hashes.
 * The hashes are SipHash-2-4 under the node's secret
 * (HTTP_HASH_KEY0/1, set at load; lib/siphash.h), so a path that hashes
 * as an allowed one cannot be computed by whoever sends requests.
 *
 * What it cannot keep in its fixed state it punts (HTTP_PUNT): a target
 * that is not "/path" or "*" (absolute form, CONNECT), a method over
 * HTTP_MAX_METHOD bytes, more path elements or host labels than it has
 * room for. A punted connection is judged in user space by the Go parser.
 *
 * Bytes are read one at a time by http_byte from a window the caller
 * loads; Content-Length bodies and chunk data are skipped by arithmetic
 * (http_skip), never read.
 */
#ifndef WEIR_LIB_HTTP_H
#define WEIR_LIB_HTTP_H

#include "common.h"
#include "l7dfa.h"
#include "siphash.h"

/* The node's hash key (internal/l7's HashKey), set at load. */
volatile const __u64 HTTP_HASH_KEY0 = 0;
volatile const __u64 HTTP_HASH_KEY1 = 0;

#define HTTP_MAX_HEAD 16384
#define HTTP_MAX_FIELDS 100
#define HTTP_MAX_CHUNK_LINE 1024
#define HTTP_MAX_TRAILER_LINE 8192
#define HTTP_MAX_METHOD 16
#define HTTP_MAX_PREFIXES 16
#define HTTP_MAX_LABELS 8
#define HTTP_MAX_HEADERS 16 /* header names watched on a node, and kept of a head */

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

/* The header names rules match on, across the node's sets, as keyed
 * hashes of their lowercase form (internal/l7's HeaderNameHash): the
 * reader hashes the value of a field whose name is one of them. A name
 * left out (more than HTTP_MAX_HEADERS on the node) is never seen in a
 * head, so the rules that name it are never met: closed, not open. */
struct l7_header_watch {
	__u64 name[HTTP_MAX_HEADERS];
	__u32 count;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct l7_header_watch);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} weir_l7_header_watch SEC(".maps");

/* What http_byte says about the byte it read. */
enum {
	HTTP_MORE,      /* read on */
	HTTP_HEAD_DONE, /* a head ended with this byte */
	HTTP_ERROR,     /* refused: the connection ends at s->unit_start */
	HTTP_PUNT,      /* a head this reader cannot hold: user space judges */
};

/* Where the reader is. */
enum {
	HS_IDLE,        /* before a request line (blank lines skipped) */
	HS_IDLE_CR,     /* a blank line's CR */
	HS_METHOD,
	HS_TARGET,      /* the first byte of the target */
	HS_PATH,
	HS_ASTERISK,
	HS_QUERY,
	HS_VERSION,
	HS_REQLINE_LF,  /* the LF ending the request line */
	HS_FIELD_LF,    /* the LF ending a field line */
	HS_FIELD_START, /* a field line's first byte, or the blank line */
	HS_FIELD_NAME,
	HS_FIELD_VALUE,
	HS_HEAD_LF,     /* the LF of the blank line ending the head */
	HS_BODY,        /* Content-Length bytes left: remaining */
	HS_CHUNK_SIZE,
	HS_CHUNK_EXT,
	HS_CHUNK_LF,
	HS_CHUNK_DATA,  /* chunk bytes left: remaining */
	HS_CHUNK_CR,    /* the CR after a chunk's data */
	HS_CHUNK_CRLF,  /* the LF after it */
	HS_TRAILER_START,
	HS_TRAILER_NAME,
	HS_TRAILER_VALUE,
	HS_TRAILER_LF,
	HS_TRAILER_END_LF,
	HS_FAILED,
};

/* Why a stream was refused or punted (http_state.error). */
enum {
	HTTP_ERR_NONE,
	HTTP_ERR_BARE_LF,
	HTTP_ERR_BARE_CR,
	HTTP_ERR_REQUEST_LINE,
	HTTP_ERR_TARGET,
	HTTP_ERR_PATH,
	HTTP_ERR_VERSION,
	HTTP_ERR_FIELD,
	HTTP_ERR_FRAMING,
	HTTP_ERR_HOST,
	HTTP_ERR_TOO_LARGE,
	HTTP_ERR_CHUNK,
	HTTP_PUNT_TARGET,
	HTTP_PUNT_METHOD,
	HTTP_PUNT_PATH,
	HTTP_PUNT_HOST,
	/* Not the reader's own: the judge's (lib/l7match.h), of a head that
	 * repeats a header a rule names. */
	HTTP_ERR_HEADER_REPEATED,
};

/* The fields a head's framing and host come from (http_state.field). */
enum {
	HF_OTHER,
	HF_HOST,
	HF_CONTENT_LENGTH,
	HF_TRANSFER_ENCODING,
	HF_CONNECTION,
	HF_UPGRADE,
	/* method and target overrides frameworks honour: refused */
	HF_METHOD_OVERRIDE,
	HF_HTTP_METHOD,
	HF_X_METHOD_OVERRIDE,
	HF_ORIGINAL_URL,
	HF_REWRITE_URL,
	HF_COUNT,
};

/* Known field names, lowercase, and the words some of their values hold. */
static const char http_field_names[HF_COUNT][32] = {
	"", "host", "content-length", "transfer-encoding", "connection", "upgrade",
	"x-http-method-override", "x-http-method", "x-method-override", "x-original-url", "x-rewrite-url",
};
static const __u8 http_field_len[HF_COUNT] = { 0, 4, 14, 17, 10, 7, 22, 13, 17, 14, 13 };
static const char http_word_chunked[16] = "chunked";
static const char http_word_close[16] = "close";
static const char http_word_keepalive[16] = "keep-alive";
static const char http_word_upgrade[16] = "upgrade";
static const char http_version_prefix[8] = "HTTP/1.";

/* Flags of a finished head (http_state.flags). */
#define HTTP_FLAG_CHUNKED 0x01
#define HTTP_FLAG_CLOSE 0x02
#define HTTP_FLAG_UPGRADE 0x04
#define HTTP_FLAG_HTTP10 0x08
#define HTTP_FLAG_NO_PATH 0x10 /* asterisk form */

/* http_state is one connection's reader. */
struct http_state {
	__u64 offset;     /* stream offset of the next byte */
	__u64 unit_start; /* first byte of the head, chunk line or trailer line being read */
	__u64 remaining;  /* body or chunk bytes left */
	__u64 content_length;
	__u64 path_hash;  /* the canonical path's hash, set when its head ends */
	__u64 prefix[HTTP_MAX_PREFIXES]; /* the path's hash before each '/' after the first */
	__u64 label[HTTP_MAX_LABELS];    /* the host's label hashes, left to right */
	struct sip path;  /* the canonical path read so far */
	struct sip lab;   /* the host label being read */
	__u64 head_start; /* the last finished head's first byte */
	__u32 unit_len;   /* bytes of the current unit */
	__u32 head_len;   /* the last finished head's length */
	__u16 fields;
	__u8 state;
	__u8 prev;        /* the byte before the next one (CR tracking) */
	__u8 error;
	__u8 flags;
	__u8 method_len;
	__u8 method[HTTP_MAX_METHOD];
	__u8 prefixes;
	__u8 labels;
	__u8 vpos;        /* bytes of the version read */
	__u8 version_minor;
	/* the path's current segment */
	__u8 seg_raw;     /* raw bytes, saturating at 2 */
	__u8 seg_canon;   /* canonical bytes before ';', saturating at 3 */
	__u8 seg_dots;    /* of those, '.' */
	__u8 in_params;
	__u8 pct;         /* hex digits of an escape read: 0, 1 or 2 */
	__u8 pct_val;
	__u8 utf8_need;   /* continuation bytes expected */
	__u8 utf8_lo, utf8_hi; /* range of the next one */
	__u8 chunk_digits;
	/* the field line being read */
	__u8 field;
	__u8 name_len;
	__u16 name_match; /* bit per HF_* still matching */
	__u8 val_ws;      /* 0 before the value, 1 in it, 2 after it (trailing OWS) */
	/* Content-Length */
	__u8 cl_count;
	__u8 cl_digits;
	__u8 cl_bad;
	/* Transfer-Encoding: one comma list over all its fields */
	__u8 te_count;
	__u8 te_el;       /* 0 leading OWS, 1 token, 2 trailing OWS */
	__u8 te_match;    /* bytes matching "chunked", 0xff none */
	__u8 te_last_chunked;
	__u8 te_bad;
	/* Connection options */
	__u8 co_el;
	__u8 co_close, co_keep, co_upgrade; /* bytes matching each word, 0xff none */
	__u8 opt_close, opt_keep, opt_upgrade;
	__u8 upgrade_count;
	/* Host */
	__u8 host_count;
	__u8 host_bad;
	__u8 host_part;   /* 0 name, 1 port, 2 IPv6 literal, 3 after it */
	__u8 host_len;    /* bytes of the name read, saturating */
	__u8 host_dot;    /* a '.' is pending (trailing dot unless more follows) */
	__u8 host_label_len;
	__u8 host_long;
	__u8 override;    /* a method or target override header was sent */
	/* In what was the struct's padding: where the Host name begins in
	 * the head, for the request's record (lib/l7events.h). */
	__u16 host_at;
	/* Watched header fields (weir_l7_header_watch): slot i holds the
	 * i-th watched name the head carries, its value's hash and whether
	 * it came more than once. */
	__u8 watching;    /* the node watches some names: field names are hashed */
	__u8 hdr_seen;    /* slots filled */
	__u8 hdr_cur;     /* the slot of the field being read, plus one; 0 none */
	__u8 hval_ows;    /* 0 before the watched value, 1 in it, 2 in OWS after it */
	__u16 hdr_dup;    /* bit per slot: the name came again */
	__u8 pad_hdr[2];
	struct sip hname; /* the field name being read, lowercase */
	struct sip hval;  /* the watched value through its last non-OWS byte */
	struct sip hval_ows_hash; /* and through the OWS after it */
	__u64 hdr_name[HTTP_MAX_HEADERS];
	__u64 hdr_val[HTTP_MAX_HEADERS];
	/* The path automata (l7dfa.h) of the sets the head is read for:
	 * dfa_set[i]'s current row is dfa_row[i] (0: dead, or none),
	 * stepped by http_path_out. Where a path begins they start from
	 * what the walker put in dfa_next_set and dfa_start for the skb. */
	__u32 dfa_set[HTTP_DFA_SETS];
	__u32 dfa_next_set[HTTP_DFA_SETS];
	__u16 dfa_row[HTTP_DFA_SETS];
	__u16 dfa_start[HTTP_DFA_SETS];
	__u32 dfa_pad;
};

__always_inline_fn __u64 fnv(__u64 h, __u8 c)
{
	return (h ^ c) * FNV_PRIME;
}

__always_inline_fn __u8 lower_ascii(__u8 c)
{
	return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

__always_inline_fn int is_digit(__u8 c)
{
	return c >= '0' && c <= '9';
}

__always_inline_fn int is_hex(__u8 c)
{
	return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

__always_inline_fn __u8 hex_val(__u8 c)
{
	if (is_digit(c))
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return c - 'A' + 10;
}

__always_inline_fn int is_alnum(__u8 c)
{
	return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

__always_inline_fn int is_unreserved(__u8 c)
{
	return is_alnum(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

/* is_tchar is RFC 9110's tchar. */
__always_inline_fn int is_tchar(__u8 c)
{
	if (is_alnum(c))
		return 1;
	switch (c) {
	case '!': case '#': case '$': case '%': case '&': case '\'': case '*':
	case '+': case '-': case '.': case '^': case '_': case '`': case '|': case '~':
		return 1;
	}
	return 0;
}

/* is_target_byte is what a target may hold (internal/l7's isTargetByte). */
__always_inline_fn int is_target_byte(__u8 c)
{
	if (is_unreserved(c))
		return 1;
	switch (c) {
	case '!': case '$': case '&': case '\'': case '(': case ')': case '*': case '+':
	case ',': case ';': case '=': case ':': case '@': case '/': case '?': case '%':
	case '[': case ']':
		return 1;
	}
	return 0;
}

/* is_value_byte is VCHAR, SP, HTAB or obs-text. */
__always_inline_fn int is_value_byte(__u8 c)
{
	return c == '\t' || (c >= 0x20 && c != 0x7f);
}

__always_inline_fn int is_ows(__u8 c)
{
	return c == ' ' || c == '\t';
}

__always_inline_fn long http_fail(struct http_state *s, __u8 why)
{
	s->state = HS_FAILED;
	s->error = why;
	return HTTP_ERROR;
}

__always_inline_fn long http_punt(struct http_state *s, __u8 why)
{
	s->state = HS_FAILED;
	s->error = why;
	return HTTP_PUNT;
}

/* http_watch_begin notes whether the node watches header names, once
 * per head: a node that does not pays nothing per field byte. */
__always_inline_fn void http_watch_begin(struct http_state *s)
{
	__u32 zero = 0;
	struct l7_header_watch *w = bpf_map_lookup_elem(&weir_l7_header_watch, &zero);

	s->watching = w && w->count;
	s->hdr_seen = 0;
	s->hdr_cur = 0;
	s->hdr_dup = 0;
}

/* http_watch_name_end looks the field name just read up in the watch
 * list: a watched name takes the next slot, or marks its slot repeated. */
__always_inline_fn void http_watch_name_end(struct http_state *s)
{
	__u32 zero = 0;
	struct l7_header_watch *w;
	__u64 h;
	int i;

	s->hdr_cur = 0;
	if (!s->watching)
		return;
	w = bpf_map_lookup_elem(&weir_l7_header_watch, &zero);
	if (!w)
		return;
	h = sip_final(&s->hname);
	for (i = 0; i < HTTP_MAX_HEADERS; i++) {
		if (i >= w->count)
			return;
		if (w->name[i] == h)
			break;
	}
	if (i == HTTP_MAX_HEADERS)
		return;
	for (i = 0; i < HTTP_MAX_HEADERS; i++) {
		if (i >= s->hdr_seen)
			break;
		if (s->hdr_name[i] == h) {
			s->hdr_dup |= 1 << i;
			return;
		}
	}
	if (s->hdr_seen >= HTTP_MAX_HEADERS)
		return; /* cannot happen: names are distinct and at most as many */
	i = s->hdr_seen & (HTTP_MAX_HEADERS - 1);
	s->hdr_name[i] = h;
	s->hdr_seen++;
	s->hdr_cur = i + 1;
	s->hval_ows = 0;
	sip_init(&s->hval, HTTP_HASH_KEY0, HTTP_HASH_KEY1);
}

/* http_watch_value_byte hashes a watched value as the Go parser keeps
 * it, without its leading and trailing OWS: OWS after a byte is hashed
 * into a copy (hval_ows 2), taken up only when another byte follows. */
__always_inline_fn void http_watch_value_byte(struct http_state *s, __u8 c)
{
	if (is_ows(c)) {
		if (s->hval_ows == 0)
			return; /* leading */
		if (s->hval_ows == 1) {
			s->hval_ows_hash = s->hval;
			s->hval_ows = 2;
		}
		sip_byte(&s->hval_ows_hash, c);
		return;
	}
	if (s->hval_ows == 2)
		s->hval = s->hval_ows_hash;
	s->hval_ows = 1;
	sip_byte(&s->hval, c);
}

/* http_watch_value_end keeps the watched value's hash in its slot. */
__always_inline_fn void http_watch_value_end(struct http_state *s)
{
	if (s->hdr_cur)
		s->hdr_val[(s->hdr_cur - 1) & (HTTP_MAX_HEADERS - 1)] = sip_final(&s->hval);
	s->hdr_cur = 0;
}

/* http_begin_head resets what a head collects. */
__always_inline_fn void http_begin_head(struct http_state *s)
{
	s->unit_len = 0;
	s->fields = 0;
	s->flags = 0;
	s->method_len = 0;
	s->prefixes = 0;
	s->labels = 0;
	sip_init(&s->lab, HTTP_HASH_KEY0, HTTP_HASH_KEY1);
	sip_init(&s->path, HTTP_HASH_KEY0, HTTP_HASH_KEY1);
	s->content_length = 0;
	s->vpos = 0;
	s->seg_raw = s->seg_canon = s->seg_dots = s->in_params = s->pct = 0;
	s->utf8_need = 0;
	s->cl_count = s->cl_digits = s->cl_bad = 0;
	s->te_count = s->te_last_chunked = s->te_bad = 0;
	s->opt_close = s->opt_keep = s->opt_upgrade = 0;
	s->upgrade_count = 0;
	s->host_count = s->host_bad = s->host_long = 0;
	s->override = 0;
	s->field = HF_OTHER;
	http_watch_begin(s);
}

/* Path canonicalisation, one target byte at a time (CanonicalPath). */

/* http_dfa_step moves each live path automaton (l7dfa.h) of s by byte c;
 * a byte over 127 (never in a canonical path) kills it. A global
 * function, verified once: stepped where the reader's per-byte work is
 * already near the verifier's budget, inlined it would not fit. */
__attribute__((noinline)) int http_dfa_step(struct http_state *s, __u32 c)
{
	struct l7_dfa_row *r;
	__u32 row, col = c;
	int i;

	if (!s)
		return 0;
	/* Mask where clang cannot fold it into the test below: the
	 * verifier needs the bound on the index itself. */
	asm volatile("" : "+r"(col));
	col &= L7_DFA_COLS - 1;
	for (i = 0; i < HTTP_DFA_SETS; i++) {
		row = s->dfa_row[i];
		if (!row)
			continue;
		r = bpf_map_lookup_elem(&weir_l7_dfa, &row);
		s->dfa_row[i] = (r && c < L7_DFA_COLS) ? r->next[col] : 0;
	}
	return 0;
}

/* http_dfa_begin starts the path automata where a path begins. */
__always_inline_fn void http_dfa_begin(struct http_state *s)
{
	s->dfa_set[0] = s->dfa_next_set[0];
	s->dfa_set[1] = s->dfa_next_set[1];
	s->dfa_set[2] = s->dfa_next_set[2];
	s->dfa_row[0] = s->dfa_start[0];
	s->dfa_row[1] = s->dfa_start[1];
	s->dfa_row[2] = s->dfa_start[2];
}

/* http_path_out feeds one byte of the canonical path to its hash and to
 * the sets' automata: every byte the hash covers, and only those. */
__always_inline_fn void http_path_out(struct http_state *s, __u8 c)
{
	sip_byte(&s->path, c);
	http_dfa_step(s, c);
}

/* http_path_emit appends one canonical byte to the path. */
__always_inline_fn void http_path_emit(struct http_state *s, __u8 c)
{
	http_path_out(s, c);
	if (s->seg_canon < 3)
		s->seg_canon++;
	if (c == '.')
		s->seg_dots++;
}

/* http_utf8 checks one decoded byte of a segment (utf8.Valid). */
__always_inline_fn int http_utf8(struct http_state *s, __u8 b)
{
	if (s->utf8_need) {
		if (b < s->utf8_lo || b > s->utf8_hi)
			return -1;
		s->utf8_need--;
		s->utf8_lo = 0x80;
		s->utf8_hi = 0xbf;
		return 0;
	}
	if (b < 0x80)
		return 0;
	s->utf8_lo = 0x80;
	s->utf8_hi = 0xbf;
	if (b >= 0xc2 && b <= 0xdf) {
		s->utf8_need = 1;
	} else if (b == 0xe0) {
		s->utf8_need = 2;
		s->utf8_lo = 0xa0;
	} else if ((b >= 0xe1 && b <= 0xec) || b == 0xee || b == 0xef) {
		s->utf8_need = 2;
	} else if (b == 0xed) {
		s->utf8_need = 2;
		s->utf8_hi = 0x9f;
	} else if (b == 0xf0) {
		s->utf8_need = 3;
		s->utf8_lo = 0x90;
	} else if (b >= 0xf1 && b <= 0xf3) {
		s->utf8_need = 3;
	} else if (b == 0xf4) {
		s->utf8_need = 3;
		s->utf8_hi = 0x8f;
	} else {
		return -1;
	}
	return 0;
}

/* http_segment_end checks the segment that just ended: not "." or "..",
 * not empty unless it is the last, not only parameters (";x" is empty
 * once they are cut), escapes that are UTF-8. */
__always_inline_fn int http_segment_end(struct http_state *s, int last)
{
	if (s->pct || s->utf8_need)
		return -1;
	if (s->seg_raw == 0 && !last)
		return -1;
	if (s->seg_raw > 0 && s->seg_canon == 0)
		return -1;
	if (s->seg_canon > 0 && s->seg_canon < 3 && s->seg_dots == s->seg_canon)
		return -1;
	return 0;
}

/* http_path_byte reads one byte of an origin-form path. */
__always_inline_fn long http_path_byte(struct http_state *s, __u8 c)
{
	if (c == '/') {
		if (http_segment_end(s, 0))
			return http_fail(s, HTTP_ERR_PATH);
		/* The path before this '/' is a prefix a PathPrefix may name. */
		if (s->prefixes >= HTTP_MAX_PREFIXES)
			return http_punt(s, HTTP_PUNT_PATH);
		s->prefix[s->prefixes & (HTTP_MAX_PREFIXES - 1)] = sip_final(&s->path);
		s->prefixes++;
		http_path_out(s, '/');
		s->seg_raw = s->seg_canon = s->seg_dots = s->in_params = 0;
		return HTTP_MORE;
	}
	if (s->seg_raw < 2)
		s->seg_raw++;
	/* Escapes are checked in the whole segment, its parameters too; only
	 * what comes before a ';' is hashed. */
	if (s->pct) {
		if (!is_hex(c))
			return http_fail(s, HTTP_ERR_PATH);
		s->pct_val = (s->pct_val << 4) | hex_val(c);
		if (s->pct == 1) {
			s->pct = 2;
			return HTTP_MORE;
		}
		s->pct = 0;
		c = s->pct_val;
		if (c == '/' || c == '\\' || c == 0 || is_unreserved(c) || http_utf8(s, c))
			return http_fail(s, HTTP_ERR_PATH);
		if (!s->in_params) {
			http_path_emit(s, '%');
			http_path_emit(s, "0123456789ABCDEF"[c >> 4]);
			http_path_emit(s, "0123456789ABCDEF"[c & 15]);
		}
		return HTTP_MORE;
	}
	switch (c) {
	case '%':
		s->pct = 1;
		s->pct_val = 0;
		return HTTP_MORE;
	case '[':
	case ']':
		return http_fail(s, HTTP_ERR_PATH);
	}
	if (http_utf8(s, c))
		return http_fail(s, HTTP_ERR_PATH);
	if (c == ';')
		s->in_params = 1;
	if (!s->in_params)
		http_path_emit(s, c);
	return HTTP_MORE;
}

/* The Host field's value (canonicalHost), one byte at a time after
 * leading whitespace. */
__always_inline_fn void http_host_label_end(struct http_state *s)
{
	if (s->labels < HTTP_MAX_LABELS)
		s->label[s->labels & (HTTP_MAX_LABELS - 1)] = sip_final(&s->lab);
	if (s->labels < 255)
		s->labels++; /* past HTTP_MAX_LABELS the head is punted */
	sip_init(&s->lab, HTTP_HASH_KEY0, HTTP_HASH_KEY1);
	s->host_label_len = 0;
}

__always_inline_fn void http_host_byte(struct http_state *s, __u8 c)
{
	switch (s->host_part) {
	case 0: /* a name: [A-Za-z0-9-._], one trailing dot dropped */
		if (s->host_len == 0)
			s->host_at = s->unit_len - 1; /* this byte's place in the head */
		if (s->host_len == 0 && c == '[') {
			s->host_part = 2;
			sip_init(&s->lab, HTTP_HASH_KEY0, HTTP_HASH_KEY1);
			sip_byte(&s->lab, '[');
			s->host_len = 1;
			return;
		}
		if (c == ':') {
			s->host_part = 1;
			return;
		}
		if (!(is_alnum(c) || c == '-' || c == '.' || c == '_')) {
			s->host_bad = 1;
			return;
		}
		if (s->host_len < 255)
			s->host_len++;
		if (c == '.') {
			/* A leading dot, or two in a row, is an empty label. */
			if (s->host_label_len == 0)
				s->host_bad = 1;
			if (s->host_dot)
				s->host_bad = 1;
			s->host_dot = 1;
			return;
		}
		if (s->host_dot) {
			http_host_label_end(s);
			s->host_dot = 0;
		}
		sip_byte(&s->lab, lower_ascii(c));
		if (s->host_label_len == 255)
			s->host_long = 1; /* a label the counter cannot hold: punted */
		else
			s->host_label_len++;
		return;
	case 1: /* the port: digits */
		if (!is_digit(c))
			s->host_bad = 1;
		return;
	case 2: /* inside an IPv6 literal */
		if (s->host_len < 255)
			s->host_len++; /* the literal's text is the name a record keeps */
		if (c == ']') {
			sip_byte(&s->lab, ']');
			http_host_label_end(s);
			s->host_part = 3;
			return;
		}
		if (!(is_hex(c) || c == ':' || c == '.')) {
			s->host_bad = 1;
			return;
		}
		sip_byte(&s->lab, lower_ascii(c));
		return;
	default: /* after the literal: ":port" or nothing */
		if (c == ':')
			s->host_part = 1;
		else
			s->host_bad = 1;
	}
}

/* http_host_end finishes the Host value. */
__always_inline_fn void http_host_end(struct http_state *s)
{
	switch (s->host_part) {
	case 2:
		s->host_bad = 1; /* unterminated literal */
		return;
	case 3:
		return; /* the literal is the one label */
	}
	if (s->host_len == 0) {
		/* An empty Host names no host; a port alone is refused. */
		if (s->host_part != 0)
			s->host_bad = 1;
		return;
	}
	if (s->host_label_len)
		http_host_label_end(s);
}

/* Field values: each known field's value, one byte at a time. val_ws
 * tracks trimming: bytes after trailing whitespace make the whitespace
 * part of the value. */

/* http_word advances a case-insensitive match of word (len n, without its
 * NUL) by c; 0xff is a mismatch. */
__always_inline_fn __u8 http_word(__u8 m, const char *word, __u8 n, __u8 c)
{
	if (m == 0xff || m >= n || lower_ascii(c) != (__u8)word[m & 15])
		return 0xff;
	return m + 1;
}

/* http_te_element_end ends one element of the Transfer-Encoding list. */
__always_inline_fn void http_te_element_end(struct http_state *s)
{
	if (s->te_el == 0) {
		s->te_bad = 1; /* empty element */
		return;
	}
	/* A chunked before the last element is refused when the next
	 * element ends; the last must be chunked (checked at the head's end). */
	if (s->te_last_chunked)
		s->te_bad = 1;
	s->te_last_chunked = s->te_match == 7;
	s->te_el = 0;
	s->te_match = 0;
}

__always_inline_fn void http_te_byte(struct http_state *s, __u8 c)
{
	if (c == ',') {
		http_te_element_end(s);
		return;
	}
	if (is_ows(c)) {
		if (s->te_el == 1)
			s->te_el = 2;
		return;
	}
	if (s->te_el == 2 || !is_tchar(c))
		s->te_bad = 1;
	s->te_el = 1;
	s->te_match = http_word(s->te_match, http_word_chunked, 7, c);
}

__always_inline_fn void http_co_element_end(struct http_state *s)
{
	if (s->co_close == 5)
		s->opt_close = 1;
	if (s->co_keep == 10)
		s->opt_keep = 1;
	if (s->co_upgrade == 7)
		s->opt_upgrade = 1;
	s->co_el = 0;
	s->co_close = s->co_keep = s->co_upgrade = 0;
}

__always_inline_fn void http_co_byte(struct http_state *s, __u8 c)
{
	if (c == ',') {
		http_co_element_end(s);
		return;
	}
	if (is_ows(c)) {
		if (s->co_el == 1)
			s->co_el = 2;
		return;
	}
	if (s->co_el == 2)
		s->co_close = s->co_keep = s->co_upgrade = 0xff;
	s->co_el = 1;
	s->co_close = http_word(s->co_close, http_word_close, 5, c);
	s->co_keep = http_word(s->co_keep, http_word_keepalive, 10, c);
	s->co_upgrade = http_word(s->co_upgrade, http_word_upgrade, 7, c);
}

/* http_value_start prepares the value of the field just named. */
__always_inline_fn void http_value_start(struct http_state *s)
{
	s->val_ws = 0;
	switch (s->field) {
	case HF_HOST:
		s->host_count++;
		s->host_part = 0;
		s->host_len = 0;
		s->host_dot = 0;
		s->host_label_len = 0;
		s->labels = 0;
		sip_init(&s->lab, HTTP_HASH_KEY0, HTTP_HASH_KEY1);
		break;
	case HF_CONTENT_LENGTH:
		s->cl_count++;
		s->cl_digits = 0;
		s->content_length = 0;
		break;
	case HF_TRANSFER_ENCODING:
		/* Fields join into one list: a second field starts a new element. */
		if (s->te_count)
			http_te_element_end(s);
		s->te_count++;
		s->te_el = 0;
		s->te_match = 0;
		break;
	case HF_CONNECTION:
		s->co_el = 0;
		s->co_close = s->co_keep = s->co_upgrade = 0;
		break;
	case HF_UPGRADE:
		s->upgrade_count++;
		break;
	case HF_METHOD_OVERRIDE:
	case HF_HTTP_METHOD:
	case HF_X_METHOD_OVERRIDE:
	case HF_ORIGINAL_URL:
	case HF_REWRITE_URL:
		s->override = 1;
		break;
	}
}

/* http_value_byte reads one byte of a known field's value. */
__always_inline_fn void http_value_byte(struct http_state *s, __u8 c)
{
	if (s->field == HF_TRANSFER_ENCODING) {
		http_te_byte(s, c);
		return;
	}
	if (s->field == HF_CONNECTION) {
		http_co_byte(s, c);
		return;
	}
	if (is_ows(c)) {
		if (s->val_ws == 1)
			s->val_ws = 2;
		return;
	}
	if (s->val_ws == 2) {
		/* whitespace inside the value */
		if (s->field == HF_CONTENT_LENGTH)
			s->cl_bad = 1;
		if (s->field == HF_HOST)
			s->host_bad = 1;
	}
	s->val_ws = 1;
	switch (s->field) {
	case HF_CONTENT_LENGTH:
		if (!is_digit(c) || s->cl_digits >= 18) {
			s->cl_bad = 1;
			return;
		}
		s->cl_digits++;
		s->content_length = s->content_length * 10 + (c - '0');
		return;
	case HF_HOST:
		http_host_byte(s, c);
		return;
	}
}

/* http_value_end finishes a known field's value at its line's end. */
__always_inline_fn void http_value_end(struct http_state *s)
{
	switch (s->field) {
	case HF_CONTENT_LENGTH:
		if (s->cl_digits == 0)
			s->cl_bad = 1;
		break;
	case HF_HOST:
		http_host_end(s);
		break;
	case HF_CONNECTION:
		http_co_element_end(s);
		break;
	}
}

/* http_method_is compares the method read with m (n bytes, n <= 7). */
__always_inline_fn int http_method_is(struct http_state *s, const char *m, __u8 n)
{
	int i;

	if (s->method_len != n)
		return 0;
	for (i = 0; i < 7; i++) {
		if (i >= n)
			break;
		if (s->method[i] != (__u8)m[i])
			return 0;
	}
	return 1;
}

/* http_bodyless says whether the method's body has no defined meaning:
 * one with a body is refused, as servers that ignore it take it for the
 * next request (internal/l7's bodylessMethods). */
__always_inline_fn int http_bodyless(struct http_state *s)
{
	return http_method_is(s, "GET", 3) || http_method_is(s, "HEAD", 4) || http_method_is(s, "DELETE", 6) ||
	       http_method_is(s, "OPTIONS", 7) || http_method_is(s, "TRACE", 5);
}

/* http_head_end applies the checks the Go parser makes of a whole head
 * (readFraming, bodies and overrides, readHost, readConnection) and sets
 * up the body. */
__always_inline_fn long http_head_end(struct http_state *s)
{
	int http11 = s->version_minor == 1;

	if (s->fields > HTTP_MAX_FIELDS)
		return http_fail(s, HTTP_ERR_TOO_LARGE);
	if (s->te_count) {
		http_te_element_end(s);
		if (s->cl_count || !http11 || s->te_bad || !s->te_last_chunked)
			return http_fail(s, HTTP_ERR_FRAMING);
		s->flags |= HTTP_FLAG_CHUNKED;
	} else if (s->cl_count > 1 || (s->cl_count == 1 && s->cl_bad)) {
		return http_fail(s, HTTP_ERR_FRAMING);
	}
	if (((s->flags & HTTP_FLAG_CHUNKED) || s->content_length) && http_bodyless(s))
		return http_fail(s, HTTP_ERR_FRAMING);
	if (s->override)
		return http_fail(s, HTTP_ERR_FIELD);
	if (s->host_count > 1 || (http11 && s->host_count == 0) || (s->host_count && s->host_bad))
		return http_fail(s, HTTP_ERR_HOST);
	if (s->labels > HTTP_MAX_LABELS || s->host_long)
		return http_punt(s, HTTP_PUNT_HOST);
	if (!http11)
		s->flags |= HTTP_FLAG_HTTP10;
	if (s->opt_close || (!http11 && !s->opt_keep))
		s->flags |= HTTP_FLAG_CLOSE;
	if (s->opt_upgrade && s->upgrade_count)
		s->flags |= HTTP_FLAG_UPGRADE;
	s->path_hash = sip_final(&s->path);
	s->head_start = s->unit_start;
	s->head_len = s->unit_len;
	if (s->flags & HTTP_FLAG_CHUNKED) {
		s->state = HS_CHUNK_SIZE;
		s->unit_len = 0;
		s->chunk_digits = 0;
		s->remaining = 0;
	} else if (s->content_length) {
		s->state = HS_BODY;
		s->remaining = s->content_length;
	} else {
		s->state = HS_IDLE;
	}
	return HTTP_HEAD_DONE;
}

/* http_name_byte reads one byte of a field name, narrowing the known
 * names it may be. */
__always_inline_fn void http_name_byte(struct http_state *s, __u8 c)
{
	__u8 i = s->name_len;
	int f;

	c = lower_ascii(c);
	if (s->watching)
		sip_byte(&s->hname, c);
	for (f = 1; f < HF_COUNT; f++) {
		if (!(s->name_match & (1 << f)))
			continue;
		if (i >= http_field_len[f] || (__u8)http_field_names[f][i & 31] != c)
			s->name_match &= ~(1 << f);
	}
	if (s->name_len < 255)
		s->name_len++;
}

/* http_name_end picks the known field the whole name is, if any. */
__always_inline_fn void http_name_end(struct http_state *s)
{
	int f;

	s->field = HF_OTHER;
	for (f = 1; f < HF_COUNT; f++) {
		if ((s->name_match & (1 << f)) && s->name_len == http_field_len[f])
			s->field = f;
	}
}

/* http_unit_byte counts one byte of the current unit against its limit
 * and checks line endings: every CR is followed by LF, every LF follows
 * a CR. Returns HTTP_MORE or the refusal. */
__always_inline_fn long http_unit_byte(struct http_state *s, __u8 c, __u32 limit)
{
	if (s->unit_len == 0)
		s->unit_start = s->offset;
	s->unit_len++;
	if (c == '\n' && s->prev != '\r')
		return http_fail(s, HTTP_ERR_BARE_LF);
	if (s->prev == '\r' && c != '\n')
		return http_fail(s, HTTP_ERR_BARE_CR);
	if (s->unit_len > limit)
		return http_fail(s, HTTP_ERR_TOO_LARGE);
	return HTTP_MORE;
}

/* http_byte reads one byte in a state that reads bytes (not HS_BODY or
 * HS_CHUNK_DATA, which http_skip moves through). */
static __always_inline long http_byte(struct http_state *s, __u8 c)
{
	long r = HTTP_MORE;

	switch (s->state) {
	case HS_IDLE:
		s->unit_len = 0;
		s->unit_start = s->offset;
		if (c == '\r') {
			s->state = HS_IDLE_CR;
			break;
		}
		if (c == '\n')
			return http_fail(s, HTTP_ERR_BARE_LF);
		http_begin_head(s);
		r = http_unit_byte(s, c, HTTP_MAX_HEAD);
		if (r != HTTP_MORE)
			return r;
		if (!is_tchar(c))
			return http_fail(s, HTTP_ERR_REQUEST_LINE);
		s->method[0] = c;
		s->method_len = 1;
		s->state = HS_METHOD;
		break;
	case HS_IDLE_CR:
		if (c != '\n')
			return http_fail(s, HTTP_ERR_BARE_CR);
		s->state = HS_IDLE;
		break;
	default:
		if (s->state > HS_HEAD_LF)
			break; /* body states are skipped, chunk states read elsewhere */
		/* Every byte of a head counts against its limit. */
		r = http_unit_byte(s, c, HTTP_MAX_HEAD);
		if (r != HTTP_MORE)
			return r;
		switch (s->state) {
		case HS_METHOD:
			if (c == ' ') {
				s->state = HS_TARGET;
				break;
			}
			if (!is_tchar(c))
				return http_fail(s, HTTP_ERR_REQUEST_LINE);
			if (s->method_len >= HTTP_MAX_METHOD)
				return http_punt(s, HTTP_PUNT_METHOD);
			s->method[s->method_len & (HTTP_MAX_METHOD - 1)] = c;
			s->method_len++;
			break;
		case HS_TARGET:
			if (c == '/') {
				/* CONNECT's target is host:port (authority form). */
				if (s->method_len == 7 && s->method[0] == 'C' && s->method[1] == 'O' &&
				    s->method[2] == 'N' && s->method[3] == 'N' && s->method[4] == 'E' &&
				    s->method[5] == 'C' && s->method[6] == 'T')
					return http_punt(s, HTTP_PUNT_TARGET);
				s->state = HS_PATH;
				sip_init(&s->path, HTTP_HASH_KEY0, HTTP_HASH_KEY1);
				http_dfa_begin(s);
				http_path_out(s, '/');
				break;
			}
			if (c == '*') {
				s->state = HS_ASTERISK;
				break;
			}
			if (c == ' ' || c == '\r' || !is_target_byte(c))
				return http_fail(s, HTTP_ERR_TARGET);
			/* Absolute form (http://host/path) or CONNECT host:port. */
			return http_punt(s, HTTP_PUNT_TARGET);
		case HS_ASTERISK:
			if (c != ' ')
				return http_fail(s, HTTP_ERR_TARGET);
			if (!(s->method_len == 7 && s->method[0] == 'O' && s->method[1] == 'P' &&
			      s->method[2] == 'T' && s->method[3] == 'I' && s->method[4] == 'O' &&
			      s->method[5] == 'N' && s->method[6] == 'S'))
				return http_fail(s, HTTP_ERR_TARGET);
			s->flags |= HTTP_FLAG_NO_PATH;
			s->state = HS_VERSION;
			break;
		case HS_PATH:
			if (c == ' ' || c == '?') {
				if (http_segment_end(s, 1))
					return http_fail(s, HTTP_ERR_PATH);
				s->state = c == ' ' ? HS_VERSION : HS_QUERY;
				break;
			}
			if (!is_target_byte(c))
				return http_fail(s, HTTP_ERR_TARGET);
			return http_path_byte(s, c);
		case HS_QUERY:
			if (c == ' ') {
				s->state = HS_VERSION;
				break;
			}
			if (!is_target_byte(c))
				return http_fail(s, HTTP_ERR_TARGET);
			break;
		case HS_VERSION:
			if (c == '\r') {
				if (s->vpos != 8)
					return http_fail(s, HTTP_ERR_VERSION);
				s->state = HS_REQLINE_LF;
				break;
			}
			if (s->vpos < 7) {
				if (c != (__u8)http_version_prefix[s->vpos & 7])
					return http_fail(s, HTTP_ERR_VERSION);
			} else if (s->vpos == 7 && (c == '0' || c == '1')) {
				s->version_minor = c - '0';
			} else {
				return http_fail(s, HTTP_ERR_VERSION);
			}
			s->vpos++;
			break;
		case HS_REQLINE_LF:
			/* http_unit_byte made sure it is the LF. */
			s->state = HS_FIELD_START;
			break;
		case HS_FIELD_LF:
			http_watch_value_end(s);
			if (s->field != HF_OTHER)
				http_value_end(s);
			s->field = HF_OTHER;
			s->state = HS_FIELD_START;
			break;
		case HS_FIELD_START:
			if (c == '\r') {
				s->state = HS_HEAD_LF;
				break;
			}
			if (is_ows(c) || c == ':' || !is_tchar(c))
				return http_fail(s, HTTP_ERR_FIELD);
			s->fields++;
			s->name_len = 0;
			s->name_match = 0xfffe;
			if (s->watching)
				sip_init(&s->hname, HTTP_HASH_KEY0, HTTP_HASH_KEY1);
			http_name_byte(s, c);
			s->state = HS_FIELD_NAME;
			break;
		case HS_FIELD_NAME:
			if (c == ':') {
				http_name_end(s);
				http_watch_name_end(s);
				http_value_start(s);
				s->state = HS_FIELD_VALUE;
				break;
			}
			if (!is_tchar(c))
				return http_fail(s, HTTP_ERR_FIELD);
			http_name_byte(s, c);
			break;
		case HS_FIELD_VALUE:
			if (c == '\r') {
				s->state = HS_FIELD_LF; /* http_value_end runs at the LF */
				break;
			}
			if (!is_value_byte(c))
				return http_fail(s, HTTP_ERR_FIELD);
			if (s->hdr_cur)
				http_watch_value_byte(s, c);
			if (s->field != HF_OTHER)
				http_value_byte(s, c);
			break;
		case HS_HEAD_LF:
			return http_head_end(s);
		}
		break;
	}
	return r;
}

/* http_chunk_byte reads one byte of a chunk line, a chunk's closing CRLF
 * or a trailer line. */
static __always_inline long http_chunk_byte(struct http_state *s, __u8 c)
{
	long r;

	switch (s->state) {
	case HS_CHUNK_CR:
		s->unit_start = s->offset;
		if (c != '\r')
			return http_fail(s, HTTP_ERR_CHUNK);
		s->state = HS_CHUNK_CRLF;
		return HTTP_MORE;
	case HS_CHUNK_CRLF:
		if (c != '\n')
			return http_fail(s, HTTP_ERR_CHUNK);
		s->state = HS_CHUNK_SIZE;
		s->unit_len = 0;
		s->chunk_digits = 0;
		s->remaining = 0;
		return HTTP_MORE;
	case HS_CHUNK_SIZE:
	case HS_CHUNK_EXT:
	case HS_CHUNK_LF:
		r = http_unit_byte(s, c, HTTP_MAX_CHUNK_LINE);
		if (r != HTTP_MORE)
			return r;
		if (s->state == HS_CHUNK_LF) {
			/* the LF: a size of 0 is the last chunk */
			if (s->remaining) {
				s->state = HS_CHUNK_DATA;
			} else {
				s->state = HS_TRAILER_START;
				s->fields = 0;
			}
			s->unit_len = 0;
			return HTTP_MORE;
		}
		if (c == '\r') {
			if (s->chunk_digits == 0)
				return http_fail(s, HTTP_ERR_CHUNK);
			s->state = HS_CHUNK_LF;
			return HTTP_MORE;
		}
		if (s->state == HS_CHUNK_EXT) {
			if (!is_value_byte(c))
				return http_fail(s, HTTP_ERR_CHUNK);
			return HTTP_MORE;
		}
		if (is_hex(c)) {
			if (s->chunk_digits == 15)
				return http_fail(s, HTTP_ERR_CHUNK);
			s->chunk_digits++;
			s->remaining = (s->remaining << 4) | hex_val(c);
			return HTTP_MORE;
		}
		if (c == ';' && s->chunk_digits) {
			s->state = HS_CHUNK_EXT;
			return HTTP_MORE;
		}
		return http_fail(s, HTTP_ERR_CHUNK);
	case HS_TRAILER_START:
	case HS_TRAILER_NAME:
	case HS_TRAILER_VALUE:
	case HS_TRAILER_LF:
	case HS_TRAILER_END_LF:
		r = http_unit_byte(s, c, HTTP_MAX_TRAILER_LINE);
		if (r != HTTP_MORE)
			return r;
		switch (s->state) {
		case HS_TRAILER_START:
			if (c == '\r') {
				s->state = HS_TRAILER_END_LF;
				return HTTP_MORE;
			}
			if (is_ows(c) || c == ':' || !is_tchar(c))
				return http_fail(s, HTTP_ERR_FIELD);
			s->state = HS_TRAILER_NAME;
			return HTTP_MORE;
		case HS_TRAILER_NAME:
			if (c == ':') {
				s->state = HS_TRAILER_VALUE;
				return HTTP_MORE;
			}
			if (!is_tchar(c))
				return http_fail(s, HTTP_ERR_FIELD);
			return HTTP_MORE;
		case HS_TRAILER_VALUE:
			if (c == '\r') {
				s->state = HS_TRAILER_LF;
				return HTTP_MORE;
			}
			if (!is_value_byte(c))
				return http_fail(s, HTTP_ERR_FIELD);
			return HTTP_MORE;
		case HS_TRAILER_LF:
			s->fields++;
			if (s->fields > HTTP_MAX_FIELDS)
				return http_fail(s, HTTP_ERR_TOO_LARGE);
			s->state = HS_TRAILER_START;
			s->unit_len = 0;
			return HTTP_MORE;
		default: /* HS_TRAILER_END_LF */
			s->state = HS_IDLE;
			s->unit_len = 0;
			return HTTP_MORE;
		}
	}
	return HTTP_MORE;
}

/* http_feed_byte reads one byte in any reading state and advances. */
static __always_inline long http_feed_byte(struct http_state *s, __u8 c)
{
	long r;

	if (s->state >= HS_CHUNK_SIZE && s->state != HS_FAILED)
		r = http_chunk_byte(s, c);
	else if (s->state == HS_FAILED)
		return s->error >= HTTP_PUNT_TARGET && s->error <= HTTP_PUNT_HOST ? HTTP_PUNT : HTTP_ERROR;
	else
		r = http_byte(s, c);
	if (r == HTTP_ERROR || r == HTTP_PUNT)
		return r;
	s->prev = c;
	s->offset++;
	return r;
}

/* A value of a field nothing reads (not Host, framing or Connection) is
 * only checked for its bytes: a caller may take a run of them at once
 * instead of one byte per http_feed_byte. */
#define HTTP_VALUE_RUN 16

/* http_in_plain_value says whether the next bytes may be taken as a run. */
__always_inline_fn int http_in_plain_value(struct http_state *s)
{
	return s->state == HS_FIELD_VALUE && s->field == HF_OTHER && !s->hdr_cur;
}

/* http_take_value takes n bytes of a plain value, the last of them last,
 * which the caller found to be value bytes (is_value_byte: no CR or LF).
 * It takes nothing when they would pass the head's limit, so that
 * http_feed_byte refuses at the very byte that does. */
__always_inline_fn __u32 http_take_value(struct http_state *s, __u32 n, __u8 last)
{
	if (!n || s->unit_len + n > HTTP_MAX_HEAD)
		return 0;
	s->unit_len += n;
	s->prev = last;
	s->offset += n;
	return n;
}

/* http_take_value_run takes the run of plain value bytes at buf[at...]
 * (indexes masked by mask, a power of two less one; at most avail bytes
 * there belong to the stream) and returns how many it took: 0 when the
 * reader is not in a plain value or the next byte is not a value byte. */
__always_inline_fn __u32 http_take_value_run(struct http_state *s, const __u8 *buf, __u32 at, __u32 mask, __u32 avail)
{
	__u32 n = 0, j;
	__u8 last = 0;

	if (!http_in_plain_value(s))
		return 0;
	for (j = 0; j < HTTP_VALUE_RUN; j++) {
		__u8 d;

		if (j >= avail)
			break;
		d = buf[(at + j) & mask];
		if (!is_value_byte(d))
			break;
		last = d;
		n++;
	}
	return http_take_value(s, n, last);
}

/* http_skip moves through up to n body or chunk bytes without reading
 * them and returns how many it moved through. */
__always_inline_fn __u64 http_skip(struct http_state *s, __u64 n)
{
	if (s->state != HS_BODY && s->state != HS_CHUNK_DATA)
		return 0;
	if (n > s->remaining)
		n = s->remaining;
	s->remaining -= n;
	s->offset += n;
	if (s->remaining == 0) {
		if (s->state == HS_BODY) {
			s->state = HS_IDLE;
		} else {
			s->state = HS_CHUNK_CR;
		}
		s->prev = 0;
		s->unit_len = 0;
	}
	return n;
}

#endif /* WEIR_LIB_HTTP_H */

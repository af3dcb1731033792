/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * iter.h: what the socket iterators (iter/tcp, iter/udp) read of the
 * kernel, and the kfunc that closes a socket from one.
 *
 * The kernel types are declared with only the fields read, marked for
 * CO-RE relocation, so no vmlinux.h is needed. An iterator walks the
 * sockets of the network namespace it is read in; bpf_sock_destroy()
 * is callable only from these iterators, which hold the socket's lock.
 */
#ifndef WEIR_LIB_ITER_H
#define WEIR_LIB_ITER_H

#include "common.h"

struct sock_common {
	__be32 skc_daddr;
	__be16 skc_dport;
	unsigned short skc_family;
	volatile unsigned char skc_state;
} __attribute__((preserve_access_index));

struct udp_sock;

struct bpf_iter_meta;

struct bpf_iter__tcp {
	struct bpf_iter_meta *meta;
	struct sock_common *sk_common;
} __attribute__((preserve_access_index));

struct bpf_iter__udp {
	struct bpf_iter_meta *meta;
	struct udp_sock *udp_sk;
} __attribute__((preserve_access_index));

/* bpf_sock_destroy aborts the socket: its owner's next call fails with
 * ECONNABORTED, and a TCP socket sends its peer a reset. */
extern int bpf_sock_destroy(struct sock_common *sk) __ksym;

/* TCP states (include/net/tcp_states.h) of sockets that are not whole
 * connected sockets, or are done: nothing to close. */
#define TCP_STATE_TIME_WAIT 6
#define TCP_STATE_CLOSE 7
#define TCP_STATE_LISTEN 10
#define TCP_STATE_NEW_SYN_RECV 12

/* iter_tcp_connected says whether an iterated TCP socket is a whole
 * socket with a connection to close. */
__always_inline_fn int iter_tcp_connected(struct sock_common *sk)
{
	unsigned char state = sk->skc_state;

	return state != TCP_STATE_TIME_WAIT && state != TCP_STATE_CLOSE && state != TCP_STATE_LISTEN &&
	       state != TCP_STATE_NEW_SYN_RECV;
}

#endif /* WEIR_LIB_ITER_H */

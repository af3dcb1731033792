// Package proxy judges in user space the HTTP connections the kernel
// hands over (bpf/lib/l7proxy.h, docs/l7.md): heads split over skbs,
// rules the kernel leaves to user space (regular expressions), heads its
// reader punts, and denials behind allowed bytes in one skb.
//
// A handed connection keeps its socket: the server still reads and
// writes the one it accepted. What changes is who reads its requests
// first. From the hand-off on, the kernel redirects every skb the
// server's socket receives into a slot's socket (datapath.ProxySlot.In);
// the proxy frames the stream with internal/l7's parser, judges each head
// with the connection's rules, and writes back what it allows, which the
// kernel puts into the server socket's receive queue. Denied requests
// are answered 403 on the server socket in the server's turn (or, when
// the server's answer to an earlier request is still to come, the
// connection is ended and reset after it); their bodies are skipped and
// the connection goes on. A stream that cannot be framed one way only is
// answered 400 and ended. Responses never pass the proxy.
//
// The decisions (stream.go) are pure and tested without a kernel; the
// slots' I/O (proxy.go) runs on the datapath's sockets.
package proxy

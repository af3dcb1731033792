package datapath

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// attachServerReader attaches the ingress reader to weir_l7_http
// (bpf/lib/l7http.h): the skb verdict that judges the requests a server
// socket receives, and the message verdict that reads the status of its
// answers (bpf/lib/l7reply.h).
func attachServerReader(objs *l7Objects) error {
	return attachReader(objs.WeirL7Http, "ingress", objs.L7HttpVerdict, objs.L7ServerMsg)
}

// attachClientReader attaches the egress reader to weir_l7_client
// (bpf/lib/l7client.h): the message verdict that judges what a client
// socket sends, and the skb verdict that passes what it receives (so
// its answers and its server's bytes share one receive queue) and reads
// the status of the server's answers.
func attachClientReader(objs *l7Objects) error {
	return attachReader(objs.WeirL7Client, "egress", objs.L7ClientSkb, objs.L7ClientMsg)
}

// attachReader attaches a reader's skb and message verdicts to its
// socket hash. A socket runs the programs the hash had when it joined:
// programs attached again (an agent restarting) reach only sockets that
// join after.
func attachReader(hash *ebpf.Map, side string, skb, msg *ebpf.Program) error {
	for _, a := range []struct {
		p    *ebpf.Program
		kind ebpf.AttachType
	}{{skb, ebpf.AttachSkSKBVerdict}, {msg, ebpf.AttachSkMsgVerdict}} {
		if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: hash.FD(), Program: a.p, Attach: a.kind}); err != nil {
			return fmt.Errorf("attach the %s reader's %v program to its socket hash: %w", side, a.kind, err)
		}
	}
	return nil
}

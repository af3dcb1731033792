package datapath

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// attachServerReader attaches the ingress reader to weir_l7_http
// (bpf/lib/l7http.h): the skb verdict that judges the requests a server
// socket receives, and the message verdict that reads the status of its
// answers (bpf/lib/l7reply.h). Like the egress reader's, they reach the
// sockets that join after.
func attachServerReader(objs *l7Objects) error {
	for _, a := range []struct {
		p    *ebpf.Program
		kind ebpf.AttachType
	}{
		{objs.L7HttpVerdict, ebpf.AttachSkSKBVerdict},
		{objs.L7ServerMsg, ebpf.AttachSkMsgVerdict},
	} {
		if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: objs.WeirL7Http.FD(), Program: a.p, Attach: a.kind}); err != nil {
			return fmt.Errorf("attach the ingress reader's %v program to weir_l7_http: %w", a.kind, err)
		}
	}
	return nil
}

// attachClientReader attaches the egress reader to weir_l7_client
// (bpf/lib/l7client.h): the message verdict that judges what a client
// socket sends, and the skb verdict that passes what it receives, so
// its answers and its server's bytes share one receive queue (and which
// reads the status of the server's answers). A socket
// runs the programs the hash had when it joined: programs attached
// again (an agent restarting) reach only sockets that join after.
func attachClientReader(objs *l7Objects) error {
	for _, a := range []struct {
		p    *ebpf.Program
		kind ebpf.AttachType
	}{
		{objs.L7ClientMsg, ebpf.AttachSkMsgVerdict},
		{objs.L7ClientSkb, ebpf.AttachSkSKBVerdict},
	} {
		if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: objs.WeirL7Client.FD(), Program: a.p, Attach: a.kind}); err != nil {
			return fmt.Errorf("attach the egress reader's %v program to weir_l7_client: %w", a.kind, err)
		}
	}
	return nil
}

package datapath

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// l7SockopsPin is the pin, under <pin>/cgroup, of l7_sockops's link.
const l7SockopsPin = "l7_sockops"

// SetupL7 makes the node read the requests of the connections policy
// restricts to HTTP rules (docs/l7.md), then EnableL7s it: bpf/l7.c is
// loaded with its maps pinned beside the others, so the sockets in
// weir_l7_http, their reader state and the sets outlive the agent (a
// socket leaving its hash loses what its queue holds); the HTTP verdict
// is attached to weir_l7_http (sockets already there keep the program
// they joined with); and l7_sockops is attached to the cgroup v2 root,
// its link pinned, or the pinned link given this program in one step.
// A restarted agent calls it again and takes all of it over.
func (n *Node) SetupL7() error {
	root, err := n.socketCgroupRoot()
	if err != nil {
		return err
	}
	return n.setupL7(root)
}

// setupL7 is SetupL7 with the cgroup the socket programs watch.
func (n *Node) setupL7(cgroup string) (retErr error) {
	if n.l7objs != nil {
		return errors.New("L7 is set up already")
	}
	spec, err := loadL7()
	if err != nil {
		return fmt.Errorf("parse the L7 socket programs: %w", err)
	}
	objs := &l7Objects{}
	if err := spec.LoadAndAssign(objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: n.cfg.PinDir}}); err != nil {
		return fmt.Errorf("load the L7 socket programs: %w", err)
	}
	defer func() {
		if retErr != nil {
			objs.Close()
		}
	}()
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: objs.WeirL7Http.FD(), Program: objs.L7HttpVerdict,
		Attach: ebpf.AttachSkSKBVerdict}); err != nil {
		return fmt.Errorf("attach the HTTP verdict to weir_l7_http: %w", err)
	}
	if err := attachCgroupPinned(objs.L7Sockops, cgroup, ebpf.AttachCGroupSockOps, filepath.Join(n.cfg.PinDir, "cgroup", l7SockopsPin)); err != nil {
		return err
	}
	if err := n.enableL7(l7Tables{match: objs.WeirL7Match, sets: objs.WeirL7Sets}, objs.WeirL7Flows); err != nil {
		return err
	}
	n.l7objs = objs
	return nil
}

// L7Stats reads the counters of the node's L7 socket path (SetupL7).
func (n *Node) L7Stats() (L7Stats, error) {
	if n.l7objs == nil {
		return L7Stats{}, errors.New("L7 is not set up on this node")
	}
	return readL7Stats(n.l7objs.WeirL7Stats)
}

// L7Ready says whether SetupL7 set the node's L7 path up.
func (n *Node) L7Ready() bool { return n.l7objs != nil }

package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/weirnet/weir/internal/l7"
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
	key, err := nodeHTTPHashKey(n.cfg.PinDir)
	if err != nil {
		return err
	}
	if err := setHTTPHashKey(spec, key); err != nil {
		return err
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
	if err := attachServerReader(objs); err != nil {
		return err
	}
	if err := attachProxyMsg(objs); err != nil {
		return err
	}
	if err := attachClientReader(objs); err != nil {
		return err
	}
	if err := attachCgroupPinned(objs.L7Sockops, cgroup, ebpf.AttachCGroupSockOps, filepath.Join(n.cfg.PinDir, "cgroup", l7SockopsPin)); err != nil {
		return err
	}
	if err := objs.WeirL7Key.Put(uint32(0), l7L7HashKey{K0: key[0], K1: key[1]}); err != nil {
		return fmt.Errorf("record the HTTP hash key: %w", err)
	}
	tables, err := openL7Tables(objs.WeirL7Match, objs.WeirL7Sets, objs.WeirL7HeaderWatch, objs.WeirL7Dfa)
	if err != nil {
		return err
	}
	if err := n.enableL7(tables, objs.WeirL7Flows, key); err != nil {
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

// nodeHTTPHashKey is the key an earlier agent's programs hash under, from
// its pinned weir_l7_key, or a new random one on a node that has none:
// the sockets in weir_l7_http keep the programs they joined with, so the
// key must outlive the agent (and goes with the pins).
func nodeHTTPHashKey(pinDir string) (l7.HashKey, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, "weir_l7_key"), &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return newHTTPHashKey()
	}
	if err != nil {
		return l7.HashKey{}, fmt.Errorf("read the pinned HTTP hash key: %w", err)
	}
	defer m.Close()
	var k l7L7HashKey
	if err := m.Lookup(uint32(0), &k); err != nil {
		return l7.HashKey{}, fmt.Errorf("read the pinned HTTP hash key: %w", err)
	}
	if k.K0 == 0 && k.K1 == 0 {
		return newHTTPHashKey() // pinned by a load that failed before writing it
	}
	return l7.HashKey{k.K0, k.K1}, nil
}

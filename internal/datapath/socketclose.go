package datapath

import (
	"errors"
	"fmt"
	"io"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/weirnet/weir/internal/service"
)

// CloseServiceSockets closes the connected sockets that the socket
// programs sent through a frontend to a backend removed lists for it, in
// the network namespaces at netnsPaths and, when it translates them, the
// node's own (bpf/sock_iter.c). A namespace that is gone is skipped: its
// sockets went with it. It is for after SetServices has taken the backends
// away, so a client that reconnects picks one that serves.
func (n *Node) CloseServiceSockets(removed map[service.Frontend][]service.Backend, netnsPaths []string) (retErr error) {
	gone := n.progs.LB4Gone
	var keys []sockLb4MemberKey
	for f, bes := range removed {
		if !f.Addr.Is4() {
			continue
		}
		for _, b := range bes {
			keys = append(keys, sockLb4MemberKey{Svc: lb4Key(f), Backend: lb4Backend(b)})
		}
	}
	if len(keys) == 0 {
		return nil
	}
	defer func() {
		for _, k := range keys {
			if err := gone.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				retErr = errors.Join(retErr, fmt.Errorf("clear removed backend: %w", err))
			}
		}
	}()
	for _, k := range keys {
		if err := gone.Put(k, uint8(1)); err != nil {
			return fmt.Errorf("list removed backend: %w", err)
		}
	}
	paths := netnsPaths
	if n.cfg.KubeProxyReplacement {
		own := n.cfg.NetNS
		if own == "" {
			own = "/proc/self/ns/net"
		}
		paths = append([]string{own}, paths...)
	}
	var errs []error
	for _, p := range paths {
		if err := n.sweepSockets(p); err != nil && !errors.Is(err, ErrNetNSNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sweepSockets runs the TCP and UDP socket iterators over the namespace at
// path: an iterator walks the sockets of the namespace it is read in.
func (n *Node) sweepSockets(path string) error {
	netns, err := getNS(path)
	if err != nil {
		return err
	}
	defer netns.Close()
	return netns.Do(func(ns.NetNS) error {
		for _, prog := range []*ebpf.Program{n.progs.SockDestroyTCP, n.progs.SockDestroyUDP} {
			if err := readIterator(prog); err != nil {
				return fmt.Errorf("close sockets in %s: %w", path, err)
			}
		}
		return nil
	})
}

func readIterator(prog *ebpf.Program) error {
	it, err := link.AttachIter(link.IterOptions{Program: prog})
	if err != nil {
		return fmt.Errorf("attach iterator %s: %w", prog, err)
	}
	defer it.Close()
	r, err := it.Open()
	if err != nil {
		return fmt.Errorf("open iterator %s: %w", prog, err)
	}
	defer r.Close()
	_, err = io.Copy(io.Discard, r)
	return err
}

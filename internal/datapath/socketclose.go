package datapath

import (
	"errors"
	"fmt"
	"io"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/weirnet/weir/internal/service"
)

// CloseServiceSockets closes the connected sockets that the socket
// programs sent through a frontend to a backend removed lists for it, in
// the network namespaces at netnsPaths and, when it translates them, the
// node's own (bpf/sock_iter.c). A namespace that is gone is skipped: its
// sockets went with it. It is for after SetServices has taken the backends
// away, so a client that reconnects picks one that serves.
func (n *Node) CloseServiceSockets(removed map[service.Frontend][]service.Backend, netnsPaths []string) error {
	gone := n.progs.LB4Gone
	var keys []sockLb4MemberKey
	external := map[sockLb4MemberKey]bool{}
	for f, bes := range removed {
		if !f.Addr.Is4() {
			continue
		}
		for _, b := range bes {
			k := sockLb4MemberKey{Svc: lb4Key(f), Backend: lb4Backend(b)}
			if f.External {
				external[k] = true
			} else {
				keys = append(keys, k)
			}
		}
	}
	if err := n.forgetNAT(external); err != nil {
		return err
	}
	paths := netnsPaths
	if n.cfg.KubeProxyReplacement {
		own := n.cfg.NetNS
		if own == "" {
			own = "/proc/self/ns/net"
		}
		paths = append([]string{own}, paths...)
	}
	// weir_lb4_gone holds so many pairs at once: a larger removal (a
	// Service of thousands of endpoints deleted) sweeps in rounds.
	limit := int(gone.MaxEntries())
	var errs []error
	for len(keys) > 0 {
		batch := keys[:min(len(keys), limit)]
		keys = keys[len(batch):]
		errs = append(errs, n.sweepRound(batch, paths))
	}
	return errors.Join(errs...)
}

// sweepRound lists batch in weir_lb4_gone, closes the sockets that went
// to its pairs in every namespace at paths, and empties the list again.
func (n *Node) sweepRound(batch []sockLb4MemberKey, paths []string) (retErr error) {
	gone := n.progs.LB4Gone
	defer func() {
		for _, k := range batch {
			if err := gone.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				retErr = errors.Join(retErr, fmt.Errorf("clear removed backend: %w", err))
			}
		}
	}()
	for _, k := range batch {
		if err := gone.Put(k, uint8(1)); err != nil {
			return fmt.Errorf("list removed backend: %w", err)
		}
	}
	var errs []error
	for _, p := range paths {
		if err := n.sweepSockets(p); err != nil && !errors.Is(err, ErrNetNSNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// forgetNAT deletes the translations of flows from outside that went
// through a frontend to a backend it no longer has (both directions), so
// their next packet is not sent to an address that may already be another
// pod's: a UDP flow picks a backend that serves, a TCP flow is answered by
// the stack with a reset. A walk of the flow map, on removals only.
func (n *Node) forgetNAT(gone map[sockLb4MemberKey]bool) error {
	if len(gone) == 0 {
		return nil
	}
	var (
		fwd hostLb4Tuple
		to  hostLb4Nat
		del []hostLb4Tuple
	)
	it := n.progs.LB4NatFwd.Iterate()
	for it.Next(&fwd, &to) {
		k := sockLb4MemberKey{
			Svc:     sockLb4Key{Vip: fwd.Daddr, Port: fwd.Dport, Proto: fwd.Proto, Scope: lbScopeExternal},
			Backend: sockLb4Backend{Addr: to.Addr, Port: to.Port},
		}
		if gone[k] {
			del = append(del, fwd)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("walk service flows: %w", err)
	}
	var errs []error
	for _, f := range del {
		var to hostLb4Nat
		if err := n.progs.LB4NatFwd.LookupAndDelete(f, &to); err != nil {
			if !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("forget service flow: %w", err))
			}
			continue
		}
		rev := hostLb4Tuple{Saddr: to.Addr, Daddr: f.Saddr, Sport: to.Port, Dport: f.Sport, Proto: f.Proto}
		if err := n.progs.LB4NatRev.Delete(rev); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("forget service flow reply: %w", err))
		}
	}
	return errors.Join(errs...)
}

// sweepSockets runs the TCP and UDP socket iterators over the namespace at
// path.
func (n *Node) sweepSockets(path string) error {
	if err := readIteratorsIn(path, n.progs.SockDestroyTCP, n.progs.SockDestroyUDP); err != nil {
		return fmt.Errorf("close sockets: %w", err)
	}
	return nil
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

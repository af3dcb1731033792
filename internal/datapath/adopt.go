package datapath

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
)

// ErrEndpointGone is returned by AdoptEndpoint when the attachment's veth
// no longer exists (the pod went away while the agent was down).
var ErrEndpointGone = errors.New("endpoint veth no longer exists")

// AdoptEndpoint takes over an attachment a previous agent made: the veth
// is found by name and the pod's MAC read from the permanent neighbour
// entry on it, so nothing is re-plumbed. The program is updated in place
// and the map entries rewritten (Publish enters the pod's namespace only
// to read its cookie).
func (n *Node) AdoptEndpoint(spec EndpointSpec) (*Endpoint, error) {
	host, err := n.nl.LinkByName(spec.HostIfName())
	if err != nil {
		if isLinkNotFound(err) {
			return nil, fmt.Errorf("%s: %w", spec.HostIfName(), ErrEndpointGone)
		}
		return nil, fmt.Errorf("find %s: %w", spec.HostIfName(), err)
	}
	ep := &Endpoint{Spec: spec, HostIfindex: host.Attrs().Index, HostMAC: host.Attrs().HardwareAddr}
	neighs, err := n.nl.NeighList(ep.HostIfindex, family(spec.Addr.Addr()))
	if err != nil {
		return nil, fmt.Errorf("list neighbours of %s: %w", spec.HostIfName(), err)
	}
	for _, nb := range neighs {
		if nb.IP.Equal(net.IP(spec.Addr.Addr().AsSlice())) && nb.State&netlink.NUD_PERMANENT != 0 {
			ep.PodMAC = nb.HardwareAddr
		}
	}
	if ep.PodMAC == nil {
		return nil, fmt.Errorf("%s has no neighbour entry for %v: attachment incomplete", spec.HostIfName(), spec.Addr.Addr())
	}
	if err := n.AttachProgram(ep); err != nil {
		return nil, err
	}
	if err := n.Publish(ep); err != nil {
		return nil, err
	}
	return ep, nil
}

// SweepOrphans removes every pod veth, link pin and endpoint map entry
// that belongs to no attachment in keep (host interface names). It is how
// a crash in the middle of an ADD or DEL is repaired.
func (n *Node) SweepOrphans(keep map[string]bool) (removed []string, _ error) {
	var errs []error
	links, err := n.nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	alive := map[int]bool{}
	for _, l := range links {
		name := l.Attrs().Name
		if _, isVeth := l.(*netlink.Veth); !isVeth || !IsHostIfName(name) || keep[name] {
			alive[l.Attrs().Index] = true
			continue
		}
		if err := n.nl.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete orphan veth %s: %w", name, err))
			continue
		}
		removed = append(removed, "veth "+name)
	}
	for _, dir := range []string{"links", "links-egress"} {
		pins, err := os.ReadDir(filepath.Join(n.cfg.PinDir, dir))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("list link pins: %w", err))
		}
		for _, p := range pins {
			if !IsHostIfName(p.Name()) || keep[p.Name()] {
				continue
			}
			errs = append(errs, detachPinned(filepath.Join(n.cfg.PinDir, dir, p.Name())))
			removed = append(removed, "pin "+dir+"/"+p.Name())
		}
	}
	entries, err := n.endpoints.list()
	if err != nil {
		errs = append(errs, err)
	}
	for _, e := range entries {
		if alive[e.HostIfindex] {
			continue
		}
		errs = append(errs, n.endpoints.delete(e.Addr))
		removed = append(removed, "endpoint "+e.Addr.String())
	}
	if err := n.forgetNetNS(func(i int) bool { return !alive[i] }); err != nil {
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

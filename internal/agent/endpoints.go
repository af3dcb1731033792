package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/ipam"
	"github.com/weirnet/weir/internal/service"
)

// addStep is one step of plumbing an endpoint.
type addStep struct {
	name string
	run  func(*datapath.Endpoint) error
}

// stepPublish makes the endpoint reachable; the program must be attached first.
const stepPublish = "publish endpoint"

// addSteps are the steps after CreateVeth that run in order; the program
// attach runs beside them (see Add).
func (a *Agent) addSteps() []addStep {
	steps := []addStep{
		{"configure pod interface", a.dp.ConfigurePod},
		{"configure host interface", a.dp.ConfigureHost},
	}
	if a.snapshot != nil {
		// Policy is compiled from the cluster's state: closed until then.
		steps = append(steps, addStep{"isolate until policy is compiled", a.dp.IsolateEndpoint})
	}
	return append(steps, addStep{stepPublish, a.dp.Publish})
}

// Add attaches a pod interface: lease an address, then plumb it step by
// step. On any failure everything done so far is undone.
func (a *Agent) Add(req api.AddRequest) (_ *api.AddResponse, retErr error) {
	if err := req.Validate(); err != nil {
		return nil, api.Errorf(api.CodeInvalidEnv, "invalid ADD request", err)
	}
	start := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()

	owner := ipam.Owner{ContainerID: req.ContainerID, IfName: req.IfName}
	if l, ok := a.ipam.Get(owner); ok {
		return nil, api.Errorf(api.CodeAttachmentInUse,
			fmt.Sprintf("container %s already has interface %s with address %v", req.ContainerID, req.IfName, l.Addr),
			errors.New("the runtime must DEL an attachment before adding it again"))
	}
	hps := hostPorts(req.PortMappings)
	for _, hp := range hps {
		if hp.HostIP.IsValid() && hp.HostIP != a.cfg.NodeIP && hp.HostIP != service.Loopback {
			// Any other address would capture this node's traffic to it
			// (a resolver, the metadata service), not only outside
			// traffic to the node.
			return nil, api.Errorf(api.CodeInvalidConfig,
				fmt.Sprintf("hostPort %d hostIP %v is neither this node's address %v nor %v", hp.Port, hp.HostIP, a.cfg.NodeIP, service.Loopback),
				errors.New("leave hostIP empty, or set it to the node's own address or 127.0.0.1 (the node's own processes only)"))
		}
		if slices.Contains(a.cfg.reservedPorts(), service.PortProto{Port: hp.Port, Proto: hp.Proto}) {
			return nil, api.Errorf(api.CodeInvalidConfig,
				fmt.Sprintf("hostPort %d/%s is the overlay's port on every node", hp.Port, protocolName(hp.Proto)),
				errors.New("pick another hostPort: the cluster's tunnel traffic arrives there"))
		}
	}
	lease, err := a.ipam.Allocate(ipam.Lease{Owner: owner, NetNS: req.NetNS, PodNamespace: req.PodNamespace, PodName: req.PodName,
		HostPorts: hps})
	if err != nil {
		if errors.Is(err, ipam.ErrPoolExhausted) {
			return nil, api.Errorf(api.CodePoolExhausted, "no free pod address on node "+a.cfg.NodeName, err)
		}
		return nil, api.Errorf(api.CodeIOFailure, "lease pod address", err)
	}
	spec := a.specFor(lease)
	defer func() {
		if retErr != nil {
			if err := a.teardown(spec, owner); err != nil {
				a.log.Error("rollback of failed ADD left state behind; GC will retry", "attachment", owner, "err", err)
			}
		}
	}()

	ep, err := a.dp.CreateVeth(spec)
	if err != nil {
		return nil, stepError("create veth", err)
	}
	// Attaching a tcx program waits out an RCU grace period (about 10 ms,
	// most of an ADD), so it runs while the pod and host ends are set up.
	// It is always awaited before this function returns: the rollback
	// above must never race a late attach and leak its pin.
	attached := make(chan error, 1)
	go func() { attached <- a.dp.AttachProgram(ep) }()
	awaitAttach := func() error {
		if attached == nil {
			return nil
		}
		err := <-attached
		attached = nil
		return err
	}
	defer awaitAttach()
	for _, s := range a.addSteps() {
		if s.name == stepPublish {
			if err := awaitAttach(); err != nil {
				return nil, stepError("attach datapath program", err)
			}
		}
		if err := s.run(ep); err != nil {
			return nil, stepError(s.name, err)
		}
	}
	if a.snapshot != nil {
		// Compile before the runtime starts the pod's containers, so they
		// start under their policy; the poke below allocates its identity.
		if s, ok := a.snapshot(); ok {
			a.applyPolicyLocked(s)
		}
	}
	if a.onEndpoint != nil {
		a.onEndpoint() // compile again with the pod's address as the API server has it
	}
	if len(lease.HostPorts) > 0 {
		a.writeServicesLocked() // the pod's hostPorts
	}
	a.log.Info("endpoint added", "attachment", owner, "addr", lease.Addr, "host", ep.Spec.HostIfName(), "pod", req.PodNamespace+"/"+req.PodName, "took", time.Since(start))
	return &api.AddResponse{
		IfName:     req.IfName,
		MAC:        ep.PodMAC.String(),
		NetNS:      req.NetNS,
		HostIfName: ep.Spec.HostIfName(),
		HostMAC:    ep.HostMAC.String(),
		Address:    spec.Addr,
		Gateway:    spec.Gateway,
		MTU:        ep.Spec.MTU,
	}, nil
}

// stepError maps datapath failures to CNI codes with a hint on what to fix.
func stepError(step string, err error) error {
	switch {
	case errors.Is(err, datapath.ErrNetNSNotFound):
		return api.Errorf(api.CodeUnknownContainer, step+": the pod's network namespace does not exist", err)
	case errors.Is(err, datapath.ErrInterfaceExists):
		return api.Errorf(api.CodeInterfaceExists, step+": the pod already has an interface of that name; pick another CNI_IFNAME", err)
	}
	return api.Errorf(api.CodeDatapath, step, err)
}

// specFor rebuilds the endpoint spec of a lease.
func (a *Agent) specFor(l ipam.Lease) datapath.EndpointSpec {
	return datapath.EndpointSpec{
		ContainerID: l.ContainerID,
		IfName:      l.IfName,
		NetNS:       l.NetNS,
		Addr:        netip.PrefixFrom(l.Addr, l.Addr.BitLen()),
		Gateway:     a.ipam.Gateway(),
		MTU:         a.dp.PodMTU(),
	}
}

// teardown removes the datapath state of an attachment, then its lease.
// The lease goes last: if the datapath cannot be cleaned, the address
// stays reserved rather than being handed to a pod it would collide with.
func (a *Agent) teardown(spec datapath.EndpointSpec, owner ipam.Owner) error {
	if err := a.dp.RemoveEndpoint(spec); err != nil {
		return fmt.Errorf("remove endpoint %s: %w", owner, err)
	}
	l, _, err := a.ipam.Release(owner)
	if err != nil {
		return fmt.Errorf("release address of %s: %w", owner, err)
	}
	if len(l.HostPorts) > 0 {
		a.writeServicesLocked() // its hostPorts go with it
	}
	return nil
}

// hostPorts converts the runtime's port mappings (validated) for a lease.
func hostPorts(ms []api.PortMapping) []ipam.HostPort {
	var out []ipam.HostPort
	for _, m := range ms {
		hp := ipam.HostPort{Port: m.HostPort, ContainerPort: m.ContainerPort, Proto: service.ProtoTCP}
		if m.Protocol == "udp" {
			hp.Proto = service.ProtoUDP
		}
		if a, err := netip.ParseAddr(m.HostIP); err == nil && a.Is4() && !a.IsUnspecified() {
			hp.HostIP = a
		}
		out = append(out, hp)
	}
	return out
}

// Del detaches a pod interface. Deleting an unknown attachment succeeds,
// as the CNI specification requires, after removing any leftovers.
func (a *Agent) Del(req api.DelRequest) error {
	if err := req.Attachment.Validate(); err != nil {
		return api.Errorf(api.CodeInvalidEnv, "invalid DEL request", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	owner := ipam.Owner{ContainerID: req.ContainerID, IfName: req.IfName}
	spec := datapath.EndpointSpec{ContainerID: req.ContainerID, IfName: req.IfName}
	if l, ok := a.ipam.Get(owner); ok {
		spec = a.specFor(l)
	}
	if err := a.teardown(spec, owner); err != nil {
		return api.Errorf(api.CodeDatapath, "delete endpoint", err)
	}
	a.log.Info("endpoint deleted", "attachment", owner)
	return nil
}

// Check verifies that an attachment is intact.
func (a *Agent) Check(req api.CheckRequest) error {
	if err := req.Attachment.Validate(); err != nil {
		return api.Errorf(api.CodeInvalidEnv, "invalid CHECK request", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	l, ok := a.ipam.Get(ipam.Owner{ContainerID: req.ContainerID, IfName: req.IfName})
	if !ok {
		return api.Errorf(api.CodeUnknownContainer, fmt.Sprintf("no attachment %s/%s on node %s", req.ContainerID, req.IfName, a.cfg.NodeName), nil)
	}
	spec := a.specFor(l)
	if req.NetNS != "" {
		spec.NetNS = req.NetNS
	}
	if err := a.dp.CheckEndpoint(spec); err != nil {
		return api.Errorf(api.CodeDatapath, "attachment is broken", err)
	}
	return nil
}

// GC releases every attachment the runtime no longer lists, then sweeps
// kernel objects that belong to no lease.
func (a *Agent) GC(req api.GCRequest) (*api.GCResponse, error) {
	valid := map[ipam.Owner]bool{}
	for _, v := range req.Valid {
		valid[ipam.Owner{ContainerID: v.ContainerID, IfName: v.IfName}] = true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	resp := &api.GCResponse{Released: []api.Attachment{}}
	var errs []error
	for _, l := range a.ipam.List() {
		if valid[l.Owner] {
			continue
		}
		if err := a.teardown(a.specFor(l), l.Owner); err != nil {
			errs = append(errs, err)
			continue
		}
		resp.Released = append(resp.Released, api.Attachment{ContainerID: l.ContainerID, IfName: l.IfName})
	}
	if err := a.sweepLocked(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return resp, api.Errorf(api.CodeDatapath, "garbage collection incomplete", err)
	}
	a.log.Info("gc done", "released", len(resp.Released))
	return resp, nil
}

// sweepLocked removes kernel objects no lease accounts for.
func (a *Agent) sweepLocked() error {
	keep := map[string]bool{}
	for _, l := range a.ipam.List() {
		keep[datapath.HostIfName(l.ContainerID, l.IfName)] = true
	}
	removed, err := a.dp.SweepOrphans(keep)
	if len(removed) > 0 {
		a.log.Info("swept orphaned datapath objects", "removed", removed)
	}
	return err
}

// adoptLocked takes over the endpoints of a previous agent run. A lease
// whose veth is gone (the pod died meanwhile, or an ADD was cut short) is
// released; the rest keep running untouched apart from a program update.
func (a *Agent) adoptLocked() error {
	var errs []error
	for _, l := range a.ipam.List() {
		spec := a.specFor(l)
		if _, err := a.dp.AdoptEndpoint(spec); err != nil {
			a.log.Info("releasing lease of endpoint that cannot be adopted", "attachment", l.Owner, "reason", err)
			if err := a.teardown(spec, l.Owner); err != nil {
				errs = append(errs, err)
			}
		}
	}
	errs = append(errs, a.sweepLocked())
	return errors.Join(errs...)
}

package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"
)

// Mode is how pod traffic reaches other nodes.
type Mode string

const (
	// ModeVXLAN encapsulates in VXLAN with the tunnel key set by the datapath.
	ModeVXLAN Mode = "vxlan"
	// ModeNative routes pod addresses unencapsulated; nodes share an L2 segment.
	ModeNative Mode = "native"
)

// ErrBadMode is returned for a Mode that is neither vxlan nor native.
var ErrBadMode = errors.New("unknown datapath mode")

// ParseMode validates a mode name.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeVXLAN, ModeNative:
		return m, nil
	}
	return "", fmt.Errorf("%q (want vxlan or native): %w", s, ErrBadMode)
}

// bpfMode is the TUNNEL_MODE constant of bpf/lib/common.h.
func (m Mode) bpfMode() uint32 {
	if m == ModeVXLAN {
		return 1
	}
	return 0
}

// ProgramConfig holds the load-time constants of the programs.
type ProgramConfig struct {
	Mode           Mode
	OverlayIfindex int
	// PodCIDR is this node's pod CIDR: its addresses never arrive from
	// another node, and one the ipcache does not know is an unidentified
	// pod, not the world.
	PodCIDR netip.Prefix
	// ClusterCIDR holds every pod address of the cluster: one that no
	// node is known to own is unidentified, and never accepted from a
	// node or the underlay.
	ClusterCIDR netip.Prefix
	// PinDir is the bpffs directory the maps are pinned in (and reused from).
	PinDir string
	// NoIdentityOption keeps native routing from putting the sending pod's
	// identity into flows' first packets as an IPv4 option
	// (bpf/lib/nativeid.h), for underlays that drop IPv4 options.
	NoIdentityOption bool
	// ExternalServices makes from_netdev translate packets from outside
	// the cluster to NodePorts, external IPs and load balancer IPs
	// (bpf/lib/nodeport.h): with no kube-proxy beside Weir. Off, the
	// branch is pruned at load and to_netdev is not attached.
	ExternalServices bool
	// HashSeed is mixed into the hash Maglev picks a NodePort flow's
	// backend with: the same on every node of a cluster, unknown outside
	// it.
	HashSeed uint64

	// senderFromCB loads copies that read the sending node and its VNI
	// from skb->cb, for BPF_PROG_RUN (trace and tests): no tunnel
	// metadata can be attached there.
	senderFromCB bool
}

// constants are the programs' load-time globals (bpf/lib/common.h).
func (cfg ProgramConfig) constants() map[string]uint32 {
	c := map[string]uint32{
		"TUNNEL_MODE":     cfg.Mode.bpfMode(),
		"OVERLAY_IFINDEX": uint32(cfg.OverlayIfindex),
	}
	setPrefix := func(name string, p netip.Prefix) {
		if p = p.Masked(); p.Addr().Is4() {
			a := p.Addr().As4()
			c[name] = binary.NativeEndian.Uint32(a[:])
			c[name+"_MASK"] = binary.NativeEndian.Uint32(net.CIDRMask(p.Bits(), 32))
		}
	}
	setPrefix("POD_CIDR_V4", cfg.PodCIDR)
	setPrefix("CLUSTER_CIDR_V4", cfg.ClusterCIDR)
	if cfg.senderFromCB {
		c["SENDER_FROM_CB"] = 1
	}
	if !cfg.NoIdentityOption {
		c["SEND_IDENTITY_OPTION"] = 1
	}
	if cfg.ExternalServices {
		c["SERVE_EXTERNAL_SERVICES"] = 1
	}
	c["HASH_SEED_LO"], c["HASH_SEED_HI"] = uint32(cfg.HashSeed), uint32(cfg.HashSeed>>32)
	return c
}

// Programs are the loaded programs of one node and the maps they share.
type Programs struct {
	FromContainer *ebpf.Program
	ToContainer   *ebpf.Program
	FromOverlay   *ebpf.Program
	ToOverlay     *ebpf.Program
	FromNetdev    *ebpf.Program

	Endpoints *ebpf.Map
	Tunnels   *ebpf.Map
	PeerNodes *ebpf.Map // underlay addresses of the peers (tunnel.h)
	Metrics   *ebpf.Map

	// Policy state (bpf/lib/identity.h, policy.h, conntrack.h, events.h).
	IPCache   *ebpf.Map
	CIDRIDs   *ebpf.Map
	EpPolicy  *ebpf.Map
	Policy    *ebpf.Map
	PolicyRev *ebpf.Map
	PolicySeq *ebpf.Map // counts writes to the maps above (policy.h)
	CT        *ebpf.Map // TCP flows
	CTAny     *ebpf.Map // flows of every other protocol
	CTRevoked *ebpf.Map // revoked flows, out of the LRU's reach (conntrack.h)
	Frags     *ebpf.Map // first fragments' ports (conntrack.h)
	Events    *ebpf.Map
	// FlowConfig turns the verdict events on and off (events.h).
	FlowConfig *ebpf.Map
	// Verdicts counts reported verdicts for the metrics (events.h).
	Verdicts *ebpf.Map

	// Socket-level Service translation (bpf/sock.c, bpf/lib/lb.h).
	SockConnect4     *ebpf.Program
	SockSendmsg4     *ebpf.Program
	SockRecvmsg4     *ebpf.Program
	SockGetpeername4 *ebpf.Program
	SockConnect6     *ebpf.Program
	SockSendmsg6     *ebpf.Program
	SockRecvmsg6     *ebpf.Program
	SockGetpeername6 *ebpf.Program
	LB4Services      *ebpf.Map
	LB4Backends      *ebpf.Map
	LB4RevNAT        *ebpf.Map
	LB4Affinity      *ebpf.Map
	LB4Members       *ebpf.Map
	LB4NodeAddrs     *ebpf.Map
	SockNetNS        *ebpf.Map
	// Noting the Service each translated flow went through, for flow
	// records (bpf/lib/lbflow.h).
	SockTCPOps  *ebpf.Program
	SockRelease *ebpf.Program
	LB4Flows    *ebpf.Map
	// Closing sockets sent to removed backends (bpf/sock_iter.c).
	SockDestroyTCP *ebpf.Program
	SockDestroyUDP *ebpf.Program
	LB4Gone        *ebpf.Map
	// Services from outside the cluster (bpf/lib/nodeport.h).
	ToNetdev  *ebpf.Program
	LB4NatFwd *ebpf.Map
	LB4NatRev *ebpf.Map
	LB4Maglev *ebpf.Map
	LB4Frags  *ebpf.Map
	// Connections L7 policy restricts, shared with the L7 socket
	// programs (bpf/lib/l7flow.h): by a server's ingress rules, and by
	// a client's egress rules.
	L7Flows *ebpf.Map
	L7Out   *ebpf.Map

	// cfg is what the programs were loaded with (Trace loads alike).
	cfg ProgramConfig
	// policySeq is PolicySeq mapped into memory.
	policySeq *policySeq
	// migration holds maps carried over from an earlier version's pins
	// until FinishMigration.
	migration *pinMigration
}

// LoadPrograms loads every entry object with cfg's constants. Maps are
// pinned by name in cfg.PinDir: an existing pin is reused, so a restarted
// agent keeps the state the running datapath already has.
func LoadPrograms(cfg ProgramConfig) (_ *Programs, retErr error) {
	consts := cfg.constants()
	p := &Programs{cfg: cfg}
	defer func() {
		if retErr != nil {
			p.Close()
		}
	}()
	specs, err := entrySpecs()
	if err != nil {
		return nil, err
	}
	// Pins an earlier version left are taken over, or the load refused,
	// before any of them is used (migrate.go): the maps that replace them
	// are loaded unpinned, and swapped in only once everything loaded.
	if p.migration, err = prepareMigration(cfg.PinDir, specs.all()); err != nil {
		return nil, err
	}
	opts := func(spec *ebpf.CollectionSpec) *ebpf.CollectionOptions {
		return &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: cfg.PinDir}, MapReplacements: p.migration.replacements(spec)}
	}

	var lxc lxcObjects
	if err := loadWithConsts(specs.lxc, consts, &lxc, opts(specs.lxc)); err != nil {
		return nil, fmt.Errorf("load from_container: %w", err)
	}
	p.FromContainer, p.ToContainer = lxc.FromContainer, lxc.ToContainer
	p.Endpoints, p.Tunnels, p.Metrics = lxc.WeirEndpoints, lxc.WeirTunnels, lxc.WeirMetrics
	p.IPCache, p.CIDRIDs, p.EpPolicy, p.Policy = lxc.WeirIpcache, lxc.WeirCidrIds, lxc.WeirEpPolicy, lxc.WeirPolicy
	p.PolicyRev, p.CT, p.Events, p.FlowConfig = lxc.WeirPolicyRev, lxc.WeirCt, lxc.WeirEvents, lxc.WeirFlowConfig
	p.PeerNodes, p.CTAny, p.CTRevoked, p.Frags = lxc.WeirPeerNodes, lxc.WeirCtAny, lxc.WeirCtRevoked, lxc.WeirFrags
	p.PolicySeq, p.Verdicts, p.LB4Flows = lxc.WeirPolicySeq, lxc.WeirVerdicts, lxc.WeirLb4Flows
	p.L7Flows, p.L7Out = lxc.WeirL7Flows, lxc.WeirL7Out
	closeMaps(lxc.WeirLb4NatFwd, lxc.WeirLb4NatRev)
	seq, err := mapPolicySeq(p.PolicySeq)
	if err != nil {
		return nil, err
	}
	p.policySeq = seq

	var ov overlayObjects
	if err := loadWithConsts(specs.overlay, consts, &ov, opts(specs.overlay)); err != nil {
		return nil, fmt.Errorf("load overlay programs: %w", err)
	}
	p.FromOverlay, p.ToOverlay = ov.FromOverlay, ov.ToOverlay
	closeMaps(ov.WeirEndpoints, ov.WeirTunnels, ov.WeirPeerNodes, ov.WeirMetrics, ov.WeirIpcache, ov.WeirCidrIds,
		ov.WeirEpPolicy, ov.WeirPolicy, ov.WeirPolicyRev, ov.WeirCt, ov.WeirCtAny, ov.WeirCtRevoked, ov.WeirFrags, ov.WeirEvents, ov.WeirFlowConfig, ov.WeirPolicySeq, ov.WeirVerdicts, ov.WeirLb4Flows, ov.WeirLb4NatFwd, ov.WeirLb4NatRev, ov.WeirL7Flows, ov.WeirL7Out)

	var host hostObjects
	if err := loadWithConsts(specs.host, consts, &host, opts(specs.host)); err != nil {
		return nil, fmt.Errorf("load from_netdev: %w", err)
	}
	p.FromNetdev, p.ToNetdev = host.FromNetdev, host.ToNetdev
	p.LB4NatFwd, p.LB4NatRev, p.LB4Maglev, p.LB4Frags = host.WeirLb4NatFwd, host.WeirLb4NatRev, host.WeirLb4Maglev, host.WeirLb4Frags
	closeMaps(host.WeirEndpoints, host.WeirTunnels, host.WeirPeerNodes, host.WeirMetrics, host.WeirIpcache, host.WeirCidrIds,
		host.WeirEpPolicy, host.WeirPolicy, host.WeirPolicyRev, host.WeirCt, host.WeirCtAny, host.WeirCtRevoked, host.WeirFrags, host.WeirEvents, host.WeirFlowConfig, host.WeirPolicySeq, host.WeirVerdicts, host.WeirLb4Flows, host.WeirL7Flows, host.WeirL7Out,
		host.WeirLb4Services, host.WeirLb4Backends, host.WeirLb4Revnat, host.WeirLb4Affinity, host.WeirLb4Members, host.WeirLb4NodeAddrs, host.WeirSockNetns)

	var sock sockObjects
	if err := loadWithConsts(specs.sock, consts, &sock, opts(specs.sock)); err != nil {
		return nil, fmt.Errorf("load socket programs: %w", err)
	}
	p.SockConnect4, p.SockSendmsg4, p.SockRecvmsg4, p.SockGetpeername4 = sock.Sock4Connect, sock.Sock4Sendmsg, sock.Sock4Recvmsg, sock.Sock4Getpeername
	p.SockConnect6, p.SockSendmsg6, p.SockRecvmsg6, p.SockGetpeername6 = sock.Sock6Connect, sock.Sock6Sendmsg, sock.Sock6Recvmsg, sock.Sock6Getpeername
	p.LB4Services, p.LB4Backends, p.LB4RevNAT, p.SockNetNS = sock.WeirLb4Services, sock.WeirLb4Backends, sock.WeirLb4Revnat, sock.WeirSockNetns
	p.LB4Affinity, p.LB4Members, p.LB4NodeAddrs = sock.WeirLb4Affinity, sock.WeirLb4Members, sock.WeirLb4NodeAddrs
	p.SockTCPOps, p.SockRelease = sock.SockTcpOps, sock.SockReleased
	closeMaps(sock.WeirMetrics, sock.WeirLb4Flows, sock.WeirLb4FlowSocks)

	// Only what the agent drives: the pinned maps the iterators read are
	// loaded for them and closed after.
	var iter struct {
		TCP  *ebpf.Program `ebpf:"sock_destroy_tcp"`
		UDP  *ebpf.Program `ebpf:"sock_destroy_udp"`
		Gone *ebpf.Map     `ebpf:"weir_lb4_gone"`
	}
	if err := loadWithConsts(specs.sockiter, consts, &iter, opts(specs.sockiter)); err != nil {
		return nil, fmt.Errorf("load socket iterators: %w", err)
	}
	p.SockDestroyTCP, p.SockDestroyUDP, p.LB4Gone = iter.TCP, iter.UDP, iter.Gone
	if err := p.migration.commit(); err != nil {
		return nil, err
	}
	if err := recordLayouts(cfg.PinDir, specs.all()); err != nil {
		return nil, err
	}
	return p, nil
}

// programSpecs are the entry objects' specs, parsed once: the pins are
// checked against all of them before any is loaded.
type programSpecs struct {
	lxc, overlay, host, sock, sockiter *ebpf.CollectionSpec
	// l7 is loaded by Node.SetupL7, not here; its pins are checked and
	// carried over with the others.
	l7 *ebpf.CollectionSpec
}

func entrySpecs() (programSpecs, error) {
	var s programSpecs
	for _, e := range []struct {
		name string
		load func() (*ebpf.CollectionSpec, error)
		to   **ebpf.CollectionSpec
	}{{"lxc", loadLxc, &s.lxc}, {"overlay", loadOverlay, &s.overlay}, {"host", loadHost, &s.host},
		{"sock", loadSock, &s.sock}, {"sockiter", loadSockiter, &s.sockiter}, {"l7", loadL7, &s.l7}} {
		spec, err := e.load()
		if err != nil {
			return s, fmt.Errorf("parse the %s object: %w", e.name, err)
		}
		*e.to = spec
	}
	return s, nil
}

func (s programSpecs) all() []*ebpf.CollectionSpec {
	return []*ebpf.CollectionSpec{s.lxc, s.overlay, s.host, s.sock, s.sockiter, s.l7}
}

// FinishMigration copies what the previous version's programs wrote into
// the maps a load carried over (see migrate.go) since, once every link
// runs this version's programs, and returns how many entries that was.
func (p *Programs) FinishMigration() (int, error) {
	m := p.migration
	p.migration = nil
	return m.finish()
}

// MigrationNotes says what the load did to an earlier version's pins.
func (p *Programs) MigrationNotes() []string {
	if p.migration == nil {
		return nil
	}
	return p.migration.notes
}

func loadWithConsts(spec *ebpf.CollectionSpec, consts map[string]uint32, to any, opts *ebpf.CollectionOptions) error {
	for name, v := range consts {
		vs, ok := spec.Variables[name]
		if !ok {
			continue // this object does not use the constant
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	return spec.LoadAndAssign(to, opts)
}

// closeMaps closes the duplicate handles an object holds on shared pins.
func closeMaps(ms ...*ebpf.Map) {
	for _, m := range ms {
		if m != nil {
			m.Close()
		}
	}
}

// Close releases the handles; pinned maps and links stay in the kernel.
func (p *Programs) Close() {
	p.policySeq.close()
	p.migration.close()
	for _, c := range []interface{ Close() error }{p.FromContainer, p.ToContainer, p.FromOverlay, p.ToOverlay, p.FromNetdev,
		p.Endpoints, p.Tunnels, p.PeerNodes, p.Metrics, p.IPCache, p.CIDRIDs, p.EpPolicy, p.Policy, p.PolicyRev, p.PolicySeq, p.CT, p.CTAny, p.CTRevoked, p.Frags, p.Events, p.FlowConfig, p.Verdicts,
		p.SockConnect4, p.SockSendmsg4, p.SockRecvmsg4, p.SockGetpeername4, p.SockConnect6, p.SockSendmsg6, p.SockRecvmsg6, p.SockGetpeername6, p.LB4Services, p.LB4Backends, p.LB4RevNAT, p.LB4Affinity, p.LB4Members, p.LB4NodeAddrs, p.SockNetNS,
		p.SockTCPOps, p.SockRelease, p.LB4Flows,
		p.SockDestroyTCP, p.SockDestroyUDP, p.LB4Gone, p.ToNetdev, p.LB4NatFwd, p.LB4NatRev, p.LB4Maglev, p.LB4Frags, p.L7Flows, p.L7Out} {
		switch v := c.(type) {
		case *ebpf.Program:
			if v != nil {
				v.Close()
			}
		case *ebpf.Map:
			if v != nil {
				v.Close()
			}
		}
	}
}

package datapath

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// masqTable is the nftables table that holds Weir's masquerade rule.
const masqTable = "weir"

// IPv4 header offsets of the source and destination address.
const (
	ipv4SrcOffset = 12
	ipv4DstOffset = 16
)

// nodePortSNATMark is WEIR_MARK_NODEPORT_SNAT (bpf/lib/nodeport.h): a
// packet from outside that from_netdev sent to a backend on another node.
const nodePortSNATMark = 0x00e80000

// installMasquerade (re)creates, in one netlink batch, the rules that
// rewrite pod traffic leaving the cluster to the node's address, and give
// Service traffic from outside that goes on to another node this node's
// address, so the reply comes back through it:
//
//	table ip weir {
//	  set nodes { type ipv4_addr; elements = { NODE_IPS } }
//	  chain postrouting { type nat hook postrouting priority srcnat
//	    ip saddr POD_CIDR ip daddr != CLUSTER_CIDR ip daddr != @nodes masquerade
//	    meta mark & MARK == MARK snat to NODE_IP:32768-60999 } }
//
// Pod-to-pod traffic never reaches it: the datapath delivers or tunnels
// those packets before the stack sees them. Other nodes are inside the
// cluster too: they see pods by their own addresses, and their replies to
// connections they opened (which bypass this node's conntrack on the way
// in) must not be rewritten on the way out.
func installMasquerade(podCIDR, clusterCIDR netip.Prefix, nodeIP netip.Addr, nodes []netip.Addr) error {
	if !podCIDR.Addr().Is4() {
		return fmt.Errorf("masquerade for %v: %w", podCIDR, ErrUnsupportedFamily)
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables connection: %w", err)
	}
	defer c.CloseLasting()

	table := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: masqTable}
	// Adding then deleting the table in the same batch clears any old
	// content without failing when it does not exist yet.
	c.AddTable(table)
	c.DelTable(table)
	c.AddTable(table)
	set := &nftables.Set{Table: table, Name: "nodes", KeyType: nftables.TypeIPAddr}
	var elems []nftables.SetElement
	for _, n := range nodes {
		if n.Is4() {
			b := n.As4()
			elems = append(elems, nftables.SetElement{Key: b[:]})
		}
	}
	if err := c.AddSet(set, elems); err != nil {
		return fmt.Errorf("node address set: %w", err)
	}
	chain := c.AddChain(&nftables.Chain{
		Name:     "postrouting",
		Table:    table,
		Type:     nftables.ChainTypeNAT,
		Hooknum:  nftables.ChainHookPostrouting,
		Priority: nftables.ChainPriorityNATSource,
	})
	var exprs []expr.Any
	exprs = append(exprs, matchPrefix(ipv4SrcOffset, podCIDR, expr.CmpOpEq)...)
	exprs = append(exprs, matchPrefix(ipv4DstOffset, clusterCIDR, expr.CmpOpNeq)...)
	exprs = append(exprs,
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: ipv4DstOffset, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, Invert: true},
	)
	exprs = append(exprs, &expr.Masq{})
	c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: exprs})
	if nodeIP.Is4() {
		c.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: snatMarked(nodeIP)})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install masquerade rule: %w", err)
	}
	return nil
}

// The source ports the SNAT of Service traffic from outside may give its
// packets: the kernel's default ephemeral range, clear of the NodePort
// range (30000-32767). Otherwise a client could pick a source port that is
// another Service's NodePort, and the backend's reply to it would arrive
// at this node looking like a new flow to that Service.
const (
	snatPortMin = 32768
	snatPortMax = 60999
)

// snatMarked gives packets carrying nodePortSNATMark the source nodeIP
// and a port in snatPortMin-snatPortMax.
func snatMarked(nodeIP netip.Addr) []expr.Any {
	mark := binary.NativeEndian.AppendUint32(nil, nodePortSNATMark)
	addr := nodeIP.As4()
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mark, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: mark},
		&expr.Immediate{Register: 1, Data: addr[:]},
		&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, snatPortMin)},
		&expr.Immediate{Register: 3, Data: binary.BigEndian.AppendUint16(nil, snatPortMax)},
		&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1,
			RegProtoMin: 2, RegProtoMax: 3, Specified: true},
	}
}

// matchPrefix compares the IPv4 address at offset, masked to p's length, with p.
func matchPrefix(offset uint32, p netip.Prefix, op expr.CmpOp) []expr.Any {
	mask := net.CIDRMask(p.Bits(), 32)
	addr := p.Masked().Addr().As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: op, Register: 1, Data: addr[:]},
	}
}

// removeMasquerade deletes Weir's table; a missing table is not an error.
func removeMasquerade() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables connection: %w", err)
	}
	defer c.CloseLasting()
	table := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: masqTable}
	c.AddTable(table)
	c.DelTable(table)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("remove masquerade table: %w", err)
	}
	return nil
}

package policy

import (
	"fmt"
	"math/bits"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// PortPrefix is a set of ports as a prefix of the 16-bit port number:
// Bits 0 means every port, 16 exactly Port.
type PortPrefix struct {
	Port uint16
	Bits uint8
}

// Contains reports whether port is in the prefix.
func (p PortPrefix) Contains(port uint16) bool {
	if p.Bits == 0 {
		return true
	}
	shift := 16 - p.Bits
	return port>>shift == p.Port>>shift
}

// String is "port/bits", or "*" for every port.
func (p PortPrefix) String() string {
	if p.Bits == 0 {
		return "*"
	}
	if p.Bits == 16 {
		return fmt.Sprint(p.Port)
	}
	return fmt.Sprintf("%d/%d", p.Port, p.Bits)
}

// AllPorts is the prefix of every port.
var AllPorts = PortPrefix{}

// RangePrefixes covers [lo, hi] exactly with the fewest aligned prefixes
// (at most 30 for a 16-bit range). lo > hi gives none.
func RangePrefixes(lo, hi uint16) []PortPrefix {
	var out []PortPrefix
	for l := uint32(lo); l <= uint32(hi); {
		// The largest block that starts at l (alignment) and ends by hi.
		size := uint32(1) << 16
		if l != 0 {
			size = uint32(1) << bits.TrailingZeros32(l)
		}
		for l+size-1 > uint32(hi) {
			size >>= 1
		}
		out = append(out, PortPrefix{Port: uint16(l), Bits: uint8(16 - bits.TrailingZeros32(size))})
		l += size
	}
	return out
}

// protoNumber maps a Kubernetes protocol (nil meaning TCP) to its number.
func protoNumber(p *corev1.Protocol) (uint8, error) {
	if p == nil {
		return ProtoTCP, nil
	}
	return ParseProtocol(string(*p))
}

// ParseProtocol maps a Kubernetes protocol name ("" meaning TCP, as in a
// container port) to its number.
func ParseProtocol(name string) (uint8, error) {
	switch corev1.Protocol(strings.ToUpper(name)) {
	case "", corev1.ProtocolTCP:
		return ProtoTCP, nil
	case corev1.ProtocolUDP:
		return ProtoUDP, nil
	case corev1.ProtocolSCTP:
		return ProtoSCTP, nil
	}
	return 0, fmt.Errorf("protocol %q: %w", name, ErrUnsupportedProtocol)
}

// ProtoName is the protocol's name as Kubernetes spells it.
func ProtoName(p uint8) string {
	switch p {
	case ProtoAny:
		return "any"
	case ProtoTCP:
		return "TCP"
	case ProtoUDP:
		return "UDP"
	case ProtoSCTP:
		return "SCTP"
	}
	return fmt.Sprint(p)
}

// namedPort looks name up among ports for proto, or for any protocol
// when proto is ProtoAny (a cluster policy's destinationNamedPort); it
// returns the port and its protocol.
func namedPort(ports []NamedPort, name string, proto uint8) (uint16, uint8, bool) {
	for _, p := range ports {
		if p.Name == name && (p.Protocol == proto || proto == ProtoAny) {
			return p.Port, p.Protocol, true
		}
	}
	return 0, 0, false
}

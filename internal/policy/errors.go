package policy

import (
	"errors"
	"fmt"
	"strings"
)

var (
	// ErrUnsupportedProtocol is a policy port with a protocol other than
	// TCP, UDP or SCTP.
	ErrUnsupportedProtocol = errors.New("unsupported protocol: use TCP, UDP or SCTP")
	// ErrInvalidPolicy is a policy the API server should have refused;
	// the compiler skips it (the endpoints it selects fail closed).
	ErrInvalidPolicy = errors.New("invalid network policy")
	// ErrPolicyTooLarge is a NetworkPolicy whose ipBlocks would take more
	// CIDR entries than the node has left (Compiler.MaxCIDRs), or one of a
	// namespace whose endpoints would take more policy keys than are left
	// (Compiler.MaxKeys): it is refused whole, and its subjects fail
	// closed in its directions, so one namespace cannot fill a node-wide
	// map that every other namespace's verdicts depend on.
	ErrPolicyTooLarge = errors.New("network policy needs more map entries than the node has left")
)

// NetworkPolicyError is the error of one NetworkPolicy in Result.Errors:
// which policy, and why its subjects fail closed.
type NetworkPolicyError struct {
	Namespace, Name string
	Err             error
	// Kind is KindWeirNetworkPolicy for one; "" or KindNetworkPolicy
	// otherwise.
	Kind string
}

func (e *NetworkPolicyError) Error() string {
	kind := "networkpolicy"
	if e.Kind != "" {
		kind = strings.ToLower(e.Kind)
	}
	return fmt.Sprintf("%s %s/%s: %v", kind, e.Namespace, e.Name, e.Err)
}

func (e *NetworkPolicyError) Unwrap() error { return e.Err }

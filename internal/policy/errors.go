package policy

import "errors"

var (
	// ErrUnsupportedProtocol is a policy port with a protocol other than
	// TCP, UDP or SCTP.
	ErrUnsupportedProtocol = errors.New("unsupported protocol: use TCP, UDP or SCTP")
	// ErrInvalidPolicy is a policy the API server should have refused;
	// the compiler skips it (the endpoints it selects fail closed).
	ErrInvalidPolicy = errors.New("invalid network policy")
)

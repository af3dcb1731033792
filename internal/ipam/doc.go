// Package ipam hands out the addresses of one node's pod CIDR and keeps its
// leases on disk, so an agent restart, crash or upgrade loses none. It is
// pure Go: the store is a JSON file replaced atomically on every change.
package ipam

package service

import (
	"hash/fnv"
	"strconv"
)

// MaglevSize is the length of a Maglev lookup table: a prime some hundreds
// of times the backends a Service has, so each holds its share within 1–2%
// and taking one away moves little more than its own entries (measured in
// maglev_test.go). bpf/lib/nodeport.h has the same number.
const MaglevSize = 16381

// Maglev is the Maglev consistent-hashing lookup table of backends (Eisenbud
// et al., NSDI 2016): entry i is the index into backends of the one a flow
// hashing to i goes to. Each backend fills the table along its own
// permutation, derived from its address alone, so every node computes the
// same table, and taking one of N backends away moves only about 1/N of
// the entries (the ones it held) plus a few more. Packets from outside the
// cluster pick backends with it, so a flow that another node or a
// reshuffled backend set now sends elsewhere mostly still lands where it
// was. Empty for no backends.
func Maglev(backends []Backend) []uint16 {
	n := len(backends)
	if n == 0 {
		return nil
	}
	offsets, skips := make([]uint64, n), make([]uint64, n)
	for i, b := range backends {
		name := b.Addr.String() + ":" + strconv.Itoa(int(b.Port))
		offsets[i] = maglevHash(name, 0) % MaglevSize
		skips[i] = maglevHash(name, 1)%(MaglevSize-1) + 1
	}
	table := make([]uint16, MaglevSize)
	filled := make([]bool, MaglevSize)
	next := make([]uint64, n)
	for placed := 0; ; {
		for i := range n {
			c := (offsets[i] + next[i]*skips[i]) % MaglevSize
			for filled[c] {
				next[i]++
				c = (offsets[i] + next[i]*skips[i]) % MaglevSize
			}
			table[c], filled[c] = uint16(i), true
			next[i]++
			if placed++; placed == MaglevSize {
				return table
			}
		}
	}
}

// maglevHash is FNV-1a of name with a seed byte: stable across nodes and
// releases, as the table must be.
func maglevHash(name string, seed byte) uint64 {
	h := fnv.New64a()
	h.Write([]byte{seed})
	h.Write([]byte(name))
	return h.Sum64()
}

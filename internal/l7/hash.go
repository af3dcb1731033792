package l7

import "strings"

// The in-kernel reader (bpf/lib/http.h) keeps no request bytes: it keeps
// keyed hashes (SipHash-2-4 under the node's HashKey) of what rules match
// on, and the rules reach it as the same hashes. These functions are the
// one definition of both sides.

// FNV-1a, which only folds hashes that are keyed already (HostHash).
const (
	fnvOffset = 0xcbf29ce484222325
	fnvPrime  = 0x100000001b3
)

// PathHash is the hash of a canonical path (CanonicalPath's output).
func PathHash(k HashKey, canonical string) uint64 { return sipString(k, canonical) }

// PathPrefixHashes are the hashes of a canonical path's prefixes that
// end before each '/' after the first: "/a/b/" has "/a" and "/a/b". A
// PathPrefix rule (its value without a trailing '/') matches a path when
// its hash is the path's own or one of these.
func PathPrefixHashes(k HashKey, canonical string) []uint64 {
	var out []uint64
	s := newSip(k)
	for i := 0; i < len(canonical); i++ {
		if i > 0 && canonical[i] == '/' {
			out = append(out, s.sum())
		}
		s.write(canonical[i])
	}
	return out
}

// HostLabelHashes are the hashes of a request host's labels, left to
// right (an IPv6 literal is one label); nil for no host.
func HostLabelHashes(k HashKey, host string) []uint64 {
	if host == "" {
		return nil
	}
	if strings.HasPrefix(host, "[") {
		return []uint64{sipString(k, host)}
	}
	labels := strings.Split(host, ".")
	out := make([]uint64, len(labels))
	for i, l := range labels {
		out[i] = sipString(k, l)
	}
	return out
}

// HeaderNameHash is the hash of a header name, which the reader hashes
// lowercase as it reads it: the names a node watches and a set's names.
func HeaderNameHash(k HashKey, name string) uint64 { return sipString(k, lower(name)) }

// HeaderValueHash is the hash of a header value as the parser keeps it
// (without leading and trailing OWS), byte for byte: Exact is
// case-sensitive.
func HeaderValueHash(k HashKey, value string) uint64 { return sipString(k, value) }

// HeaderKey folds a header's name and value hashes into one lookup hash.
// For one name it is a bijection of the value's hash, so two values never
// share a key.
func HeaderKey(name, value uint64) uint64 { return (name * fnvPrime) ^ value }

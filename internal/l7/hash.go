package l7

import "strings"

// The in-kernel reader (bpf/lib/http.h) keeps no request bytes: it keeps
// FNV-1a hashes of what rules match on, and the rules reach it as the
// same hashes. These functions are the one definition of both sides.

const (
	fnvOffset = 0xcbf29ce484222325
	fnvPrime  = 0x100000001b3
)

func fnv(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * fnvPrime
	}
	return h
}

// PathHash is the hash of a canonical path (CanonicalPath's output).
func PathHash(canonical string) uint64 { return fnv(fnvOffset, canonical) }

// PathPrefixHashes are the hashes of a canonical path's prefixes that
// end before each '/' after the first: "/a/b/" has "/a" and "/a/b". A
// PathPrefix rule (its value without a trailing '/') matches a path when
// its hash is the path's own or one of these.
func PathPrefixHashes(canonical string) []uint64 {
	var out []uint64
	for i := 1; i < len(canonical); i++ {
		if canonical[i] == '/' {
			out = append(out, PathHash(canonical[:i]))
		}
	}
	return out
}

// HostLabelHashes are the hashes of a request host's labels, left to
// right (an IPv6 literal is one label); nil for no host.
func HostLabelHashes(host string) []uint64 {
	if host == "" {
		return nil
	}
	if strings.HasPrefix(host, "[") {
		return []uint64{fnv(fnvOffset, host)}
	}
	labels := strings.Split(host, ".")
	out := make([]uint64, len(labels))
	for i, l := range labels {
		out[i] = fnv(fnvOffset, l)
	}
	return out
}

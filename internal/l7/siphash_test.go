package l7

import (
	"encoding/binary"
	"testing"
)

// TestSipHashVectors holds sipState to SipHash-2-4's published test
// vectors (key 00 01 .. 0f, message 00 01 .. n-1).
func TestSipHashVectors(t *testing.T) {
	var kb [16]byte
	for i := range kb {
		kb[i] = byte(i)
	}
	k := HashKey{binary.LittleEndian.Uint64(kb[:8]), binary.LittleEndian.Uint64(kb[8:])}
	for n, want := range map[int]uint64{0: 0x726fdb47dd0e0e31, 1: 0x74f839c593dc67fd, 7: 0xab0200f58b01d137,
		8: 0x93f5f5799a932462, 15: 0xa129ca6149be45e5, 63: 0x958a324ceb064572} {
		msg := make([]byte, n)
		for i := range msg {
			msg[i] = byte(i)
		}
		if got := sipString(k, string(msg)); got != want {
			t.Errorf("SipHash-2-4 of %d bytes: %#x, want %#x", n, got, want)
		}
	}
}

// TestKernelHashesAreKeyed: the lookups of one rule set differ under
// two keys, and a request is judged alike under either, so a rule's
// hashes say nothing to whoever lacks the node's key.
func TestKernelHashesAreKeyed(t *testing.T) {
	rules := []Rule{{Method: "POST", Path: &PathMatch{Type: PathExact, Value: "/v1/request-landing"}, Hostnames: []string{"*.empire"}}}
	a, err := CompileKernel(rules, HashKey{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	b, err := CompileKernel(rules, HashKey{3, 4})
	if err != nil {
		t.Fatal(err)
	}
	for key := range a.Entries {
		if _, ok := b.Entries[key]; ok {
			t.Errorf("lookup %+v is the same under two keys", key)
		}
	}
	reqs, err := NewParser(Limits{}).Feed([]byte("POST /v1/request-landing HTTP/1.1\r\nHost: deathstar.empire\r\nContent-Length: 0\r\n\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	if a.Judge(reqs[0]) != KernelAllow || b.Judge(reqs[0]) != KernelAllow {
		t.Fatal("the landing is not allowed under both keys")
	}
	// A path's prefix hashes are those of its prefixes.
	k := HashKey{5, 6}
	if got := PathPrefixHashes(k, "/a/b/c"); len(got) != 2 || got[0] != PathHash(k, "/a") || got[1] != PathHash(k, "/a/b") {
		t.Fatalf("prefix hashes %x", got)
	}
}

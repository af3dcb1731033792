package datapath

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/weirnet/weir/internal/testutil"
)

// TestCountEntries counts an LRU hash (as conntrack) and an LPM trie (as
// the policy map) in batches and key by key, whole and up to a limit.
func TestCountEntries(t *testing.T) {
	testutil.RequireRoot(t)
	for _, c := range []struct {
		name string
		spec *ebpf.MapSpec
		put  func(m *ebpf.Map, i uint32) error
	}{
		{"lru hash", &ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: 4, ValueSize: 8, MaxEntries: 20000},
			func(m *ebpf.Map, i uint32) error { return m.Put(i, uint64(i)) }},
		{"lpm trie", &ebpf.MapSpec{Type: ebpf.LPMTrie, KeySize: 8, ValueSize: 4, MaxEntries: 20000, Flags: 1}, // BPF_F_NO_PREALLOC
			func(m *ebpf.Map, i uint32) error { return m.Put([2]uint32{32, i}, i) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := ebpf.NewMap(c.spec)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			const n = 9000 // more than two batches
			for i := range uint32(n) {
				if err := c.put(m, i); err != nil {
					t.Fatal(err)
				}
			}
			var got [4]int
			var errs [4]error
			if c.spec.Type == ebpf.LRUHash {
				got[0], errs[0] = countEntries[uint32, uint64](m, 0)
				got[1], errs[1] = countEntries[uint32, uint64](m, 10)
				// Every kernel Weir supports batches hash maps.
				if _, err := countInBatches[uint32, uint64](m, 0); err != nil {
					t.Errorf("batch count of an LRU hash: %v", err)
				}
			} else {
				got[0], errs[0] = countEntries[[2]uint32, uint32](m, 0)
				got[1], errs[1] = countEntries[[2]uint32, uint32](m, 10)
				_, err := countInBatches[[2]uint32, uint32](m, 0)
				t.Logf("batch count of an LPM trie: %v (nil: batched)", err)
			}
			got[2], errs[2] = countKeys(m, 0)
			got[3], errs[3] = countKeys(m, 10)
			for i, want := range []int{n, countBatch, n, 10} {
				if errs[i] != nil || (i != 1 && got[i] != want) || (i == 1 && (got[i] < 10 || got[i] > want)) {
					t.Errorf("count %d: %d (%v), want %d", i, got[i], errs[i], want)
				}
			}
		})
	}
}

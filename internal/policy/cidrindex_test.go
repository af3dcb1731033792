package policy

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestWithinMatchesScan checks the sorted-run search against the plain
// definition (every numbered prefix the block covers) on random prefixes
// of both families, nested and overlapping.
func TestWithinMatchesScan(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 7))
	randPrefix := func() netip.Prefix {
		if r.IntN(4) == 0 {
			var b [16]byte
			b[0], b[1], b[15] = 0xfd, byte(r.IntN(4)), byte(r.IntN(256))
			return netip.PrefixFrom(netip.AddrFrom16(b), 8+r.IntN(121)).Masked()
		}
		a := netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(4)), byte(r.IntN(256))})
		return netip.PrefixFrom(a, r.IntN(33)).Masked()
	}
	for round := 0; round < 200; round++ {
		ids := map[netip.Prefix]Identity{}
		for i := 0; i < 1+r.IntN(60); i++ {
			ids[randPrefix()] = Identity(1000 + i)
		}
		sorted := sortedPrefixes(ids)
		for q := 0; q < 20; q++ {
			block := randPrefix()
			want := map[netip.Prefix]bool{}
			for p := range ids {
				if prefixCovers(block, p) {
					want[p] = true
				}
			}
			got := within(sorted, block)
			if len(got) != len(want) {
				t.Fatalf("round %d: %v covers %d prefixes, within found %d (%v)", round, block, len(want), len(got), got)
			}
			for _, np := range got {
				if !want[np.p] || ids[np.p] != np.id {
					t.Fatalf("round %d: within(%v) returned %v (id %d), not covered or misnumbered", round, block, np.p, np.id)
				}
			}
		}
	}
}

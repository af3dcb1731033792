package service

import (
	"fmt"
	"net/netip"
	"testing"
)

func maglevBackends(n int) []Backend {
	out := make([]Backend, n)
	for i := range out {
		out[i] = Backend{Addr: netip.AddrFrom4([4]byte{10, 244, byte(i / 200), byte(i%200 + 2)}), Port: 8080}
	}
	return out
}

// TestMaglevBalanceAndDisruption measures the table: every backend holds
// its share within 2%, and taking one of N away (or adding one) changes
// the backend of no more than the entries it held plus 2% of the table.
func TestMaglevBalanceAndDisruption(t *testing.T) {
	for _, n := range []int{2, 3, 10, 40} {
		t.Run(fmt.Sprint(n, " backends"), func(t *testing.T) {
			bes := maglevBackends(n)
			table := Maglev(bes)
			if len(table) != MaglevSize {
				t.Fatalf("table of %d entries, want %d", len(table), MaglevSize)
			}
			held := make([]int, n)
			for _, i := range table {
				held[i]++
			}
			share := float64(MaglevSize) / float64(n)
			for i, h := range held {
				if d := float64(h)/share - 1; d > 0.02 || d < -0.02 {
					t.Errorf("backend %d holds %d entries, %.1f%% off its share %.0f", i, h, 100*d, share)
				}
			}
			// One backend goes.
			gone := n / 2
			rest := append(append([]Backend{}, bes[:gone]...), bes[gone+1:]...)
			after := Maglev(rest)
			moved := 0
			for e := range table {
				if bes[table[e]] != rest[after[e]] {
					moved++
				}
			}
			if limit := held[gone] + MaglevSize/50; moved > limit {
				t.Errorf("removing 1 of %d moved %d entries (%.1f%%), want at most %d (its own %d and 2%%)",
					n, moved, 100*float64(moved)/MaglevSize, limit, held[gone])
			}
			t.Logf("removing 1 of %d backends moved %.1f%% of entries (1/N = %.1f%%)", n, 100*float64(moved)/MaglevSize, 100/float64(n))
		})
	}
	if Maglev(nil) != nil {
		t.Error("a table for no backends")
	}
}

// TestMaglevIsStable: the table depends on the backends alone, so every
// node builds the same one.
func TestMaglevIsStable(t *testing.T) {
	a, b := Maglev(maglevBackends(7)), Maglev(maglevBackends(7))
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("entry %d differs between two builds", i)
		}
	}
}

package datapath

import (
	"errors"
	"testing"

	"github.com/weirnet/weir/internal/l7"
)

// TestL7DFARows: the sets' automata share weir_l7_dfa without overlap;
// a set whose automaton finds no room is still written, its expressions
// left to user space (never closed, never open); a deleted set's rows
// serve the next; and tables opened again over the same maps (a
// restarted agent) find the rows in use from the set rows.
func TestL7DFARows(t *testing.T) {
	r := loadHTTPReader(t)
	defer r.objs.Close()
	open := func() l7Tables {
		t.Helper()
		tables, err := openL7Tables(r.objs.WeirL7Match, r.objs.WeirL7Sets, r.objs.WeirL7HeaderWatch, r.objs.WeirL7Dfa)
		if err != nil {
			t.Fatal(err)
		}
		return tables
	}
	tables := open()
	// About a thousand states each: sixteen fill the 16,384 rows.
	big := []l7.Rule{{Path: &l7.PathMatch{Type: l7.PathRegularExpression, Value: "/[a-z]{0,1000}"}}}
	k, err := l7.CompileKernel(big, testHTTPKey)
	if err != nil {
		t.Fatal(err)
	}
	if k.PathDFA == nil || k.UserSpace != 0 || len(k.PathDFA.Next) < 1000 {
		t.Fatalf("compiled %+v: want an automaton of 1,000 states or more", k)
	}
	rows := len(k.PathDFA.Next) - 1
	fit := int(r.objs.WeirL7Dfa.MaxEntries()-1) / rows
	for id := uint32(1); id <= uint32(fit)+1; id++ {
		if err := tables.writeSet(id, k); err != nil {
			t.Fatal(err)
		}
	}
	var last l7L7Set
	if err := r.objs.WeirL7Sets.Lookup(uint32(fit+1), &last); err != nil {
		t.Fatal(err)
	}
	if last.DfaRows != 0 || last.UserSpace != 1 || last.AnyPath != 1 || last.PathRe != 0 {
		t.Fatalf("the set past the rows: %+v, want its expression left to user space", last)
	}
	// No two sets' runs overlap, and none takes row 0.
	seen := map[uint32]uint32{}
	for id := uint32(1); id <= uint32(fit); id++ {
		var row l7L7Set
		if err := r.objs.WeirL7Sets.Lookup(id, &row); err != nil {
			t.Fatal(err)
		}
		if row.DfaBase == 0 || row.DfaRows != uint32(rows) || row.PathRe != 1 {
			t.Fatalf("set %d: %+v", id, row)
		}
		for i := row.DfaBase; i < row.DfaBase+row.DfaRows; i++ {
			if other, ok := seen[i]; ok {
				t.Fatalf("row %d held by sets %d and %d", i, other, id)
			}
			seen[i] = id
		}
	}
	// A set never changes under its ID: rows for an ID holding some are
	// refused (an skb read with the old rows would meet the new masks).
	if err := tables.writeSet(2, k); !errors.Is(err, errDFASetHeld) {
		t.Fatalf("writing set 2 again: %v, want errDFASetHeld", err)
	}
	// A restarted agent's tables know what is held.
	again := open()
	if again.dfa.held() != fit*rows {
		t.Fatalf("reopened: %d rows held, want %d", again.dfa.held(), fit*rows)
	}
	// A deleted set's rows go to the next set.
	if err := again.deleteSet(3, k); err != nil {
		t.Fatal(err)
	}
	if err := again.writeSet(100, k); err != nil {
		t.Fatal(err)
	}
	var row3, row100 l7L7Set
	r.objs.WeirL7Sets.Lookup(uint32(100), &row100)
	if row100.DfaRows != uint32(rows) || seen[row100.DfaBase] != 3 {
		t.Fatalf("set 100 after set 3 was deleted: %+v, want set 3's rows", row100)
	}
	if err := r.objs.WeirL7Sets.Lookup(uint32(3), &row3); err == nil {
		t.Fatal("set 3's row is still there")
	}
	// deleteUpTo (an earlier agent's sets) gives every run back.
	if err := again.deleteUpTo(1000); err != nil {
		t.Fatal(err)
	}
	if n := again.dfa.held(); n != 0 {
		t.Fatalf("%d rows held after every set went", n)
	}
}

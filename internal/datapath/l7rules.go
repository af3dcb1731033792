package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/weirnet/weir/internal/l7"
)

// l7Tables are the kernel's HTTP rule tables (bpf/lib/l7match.h):
// weir_l7_match, the lookups, and weir_l7_sets, a row per set; and the
// reader's watch list of the header names they match on.
type l7Tables struct {
	match, sets *ebpf.Map
	watch       *headerWatch
	// dfa holds the sets' path automata (weir_l7_dfa).
	dfa *dfaRows
}

// openL7Tables takes over the tables, and the watch list and automata
// as an earlier agent left them.
func openL7Tables(match, sets, watch, dfa *ebpf.Map) (l7Tables, error) {
	w, err := openHeaderWatch(watch)
	if err != nil {
		return l7Tables{}, err
	}
	d, err := openDFARows(dfa, sets)
	if err != nil {
		return l7Tables{}, err
	}
	return l7Tables{match: match, sets: sets, watch: w, dfa: d}, nil
}

// writeSet writes set id: its lookups first, its row last, so a request
// judged meanwhile finds no row and is denied, never judged against half
// a set. A set's content never changes under its ID (the compiler interns
// sets by content): a changed set is a new ID.
//
// A set with header rules is written once the reader watches its header
// names; a set whose names do not fit the watch list is not written (its
// allows stay closed). A set's path automaton is written before its row
// too; one the rows cannot hold leaves its expressions to user space.
func (t l7Tables) writeSet(id uint32, k *l7.KernelRules) (retErr error) {
	if len(k.Headers) > 0 {
		if err := t.watch.add(k.Headers); err != nil {
			return fmt.Errorf("HTTP set %d: %w", id, err)
		}
		defer func() {
			if retErr != nil {
				retErr = errors.Join(retErr, t.watch.remove(k.Headers))
			}
		}()
	}
	for key, mask := range k.Entries {
		if err := t.match.Put(l7MatchKey(id, key), mask); err != nil {
			return fmt.Errorf("write HTTP set %d lookup %+v: %w", id, key, err)
		}
	}
	var dfa dfaExtent
	if k.PathDFA != nil {
		var err error
		dfa, err = t.dfa.write(id, k.PathDFA)
		switch {
		case errors.Is(err, errDFARowsFull):
			k = withoutDFA(k)
		case err != nil:
			return err
		}
		defer func() {
			if retErr != nil {
				t.dfa.release(id)
			}
		}()
	}
	if err := t.sets.Put(id, l7SetRow(k, dfa)); err != nil {
		return fmt.Errorf("write HTTP set %d: %w", id, err)
	}
	return nil
}

// l7SetRow is a set's weir_l7_sets row, with its automaton's rows.
func l7SetRow(k *l7.KernelRules, dfa dfaExtent) l7L7Set {
	row := l7L7Set{AnyMethod: k.AnyMethod, AnyPath: k.AnyPath, AnyHost: k.AnyHost, NeedsPath: k.NeedsPath, UserSpace: k.UserSpace,
		HeaderRules: k.HeaderRules, Nheaders: uint32(len(k.Headers)), DfaBase: dfa.base, DfaRows: dfa.rows}
	for i, h := range k.Headers {
		row.Hname[i], row.Hneed[i], row.Hany[i] = h.Hash, h.Need, h.Any
	}
	if k.PathDFA != nil {
		row.PathRe = k.PathDFA.Rules
	}
	return row
}

// deleteSet removes set id: its row first, so requests stop being judged
// against it (closed) before its lookups and automaton go.
func (t l7Tables) deleteSet(id uint32, k *l7.KernelRules) error {
	var errs []error
	if err := t.sets.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		errs = append(errs, fmt.Errorf("delete HTTP set %d: %w", id, err))
	} else {
		// A head that began with the set and ends after it finds no
		// row, and is denied, whatever its automaton reads meanwhile.
		t.dfa.release(id)
	}
	for key := range k.Entries {
		if err := t.match.Delete(l7MatchKey(id, key)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete HTTP set %d lookup %+v: %w", id, key, err))
		}
	}
	if len(k.Headers) > 0 && len(errs) == 0 {
		errs = append(errs, t.watch.remove(k.Headers))
	}
	return errors.Join(errs...)
}

// deleteUpTo removes every set numbered up to high, rows first, without
// their compiled rules: an earlier agent's.
func (t l7Tables) deleteUpTo(high uint32) error {
	var errs []error
	var id uint32
	var row l7L7Set
	var ids []uint32
	it := t.sets.Iterate()
	for it.Next(&id, &row) {
		if id <= high {
			ids = append(ids, id)
		}
	}
	errs = append(errs, it.Err())
	for _, id := range ids {
		if err := t.sets.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete HTTP set %d: %w", id, err))
			continue
		}
		t.dfa.release(id)
	}
	var k l7L7MatchKey
	var mask uint64
	var keys []l7L7MatchKey
	mit := t.match.Iterate()
	for mit.Next(&k, &mask) {
		if k.Set <= high {
			keys = append(keys, k)
		}
	}
	errs = append(errs, mit.Err())
	for _, k := range keys {
		if err := t.match.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete HTTP set %d lookup: %w", k.Set, err))
		}
	}
	if errors.Join(errs...) == nil {
		errs = append(errs, t.watch.release())
	}
	return errors.Join(errs...)
}

func l7MatchKey(id uint32, k l7.KernelKey) l7L7MatchKey {
	return l7L7MatchKey{Set: id, Kind: uint8(k.Kind), Hash: k.Hash}
}

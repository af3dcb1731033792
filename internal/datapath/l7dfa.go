package datapath

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/weirnet/weir/internal/l7"
)

// errDFARowsFull is a set's path automaton that finds no run of free rows
// long enough in weir_l7_dfa: its expressions are judged in user space.
var errDFARowsFull = errors.New("no room for the path automaton in weir_l7_dfa")

// dfaExtent is the run of weir_l7_dfa rows one set's automaton holds.
type dfaExtent struct{ base, rows uint32 }

// dfaRows hands out runs of weir_l7_dfa (bpf/lib/l7dfa.h) to the sets'
// path automata. Row 0 is the dead state every automaton shares: never
// written. Which set holds which run is in the sets' own rows, so an
// agent taking over pinned maps finds what is in use there.
type dfaRows struct {
	m *ebpf.Map
	// mu guards bySet.
	mu    sync.Mutex
	bySet map[uint32]dfaExtent
}

// openDFARows takes over m, with the runs the rows of sets name.
func openDFARows(m, sets *ebpf.Map) (*dfaRows, error) {
	p := &dfaRows{m: m, bySet: map[uint32]dfaExtent{}}
	var (
		id  uint32
		row l7L7Set
	)
	it := sets.Iterate()
	for it.Next(&id, &row) {
		if row.DfaRows > 0 {
			p.bySet[id] = dfaExtent{row.DfaBase, row.DfaRows}
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read the HTTP sets' automata: %w", err)
	}
	return p, nil
}

// errDFASetHeld is a set ID that holds rows already: a set never changes
// under its ID (an skb read with the old rows would be judged with the
// new set's masks).
var errDFASetHeld = errors.New("holds automaton rows already: a changed set takes a new ID")

// alloc finds the first run of n free rows (after row 0), within the map
// and within what a row number (u16) can name.
func (p *dfaRows) alloc(id, n uint32) (uint32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.bySet[id]; ok {
		return 0, fmt.Errorf("HTTP set %d %w", id, errDFASetHeld)
	}
	used := make([]dfaExtent, 0, len(p.bySet))
	for _, e := range p.bySet {
		used = append(used, e)
	}
	slices.SortFunc(used, func(a, b dfaExtent) int { return int(a.base) - int(b.base) })
	next := uint32(1)
	for _, e := range used {
		if e.base-next >= n {
			break
		}
		next = e.base + e.rows
	}
	if next+n > min(p.m.MaxEntries(), 1<<16) {
		return 0, fmt.Errorf("%w: %d rows wanted", errDFARowsFull, n)
	}
	p.bySet[id] = dfaExtent{next, n}
	return next, nil
}

// release gives set id's run back.
func (p *dfaRows) release(id uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.bySet, id)
}

// held is how many rows the sets hold.
func (p *dfaRows) held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, e := range p.bySet {
		n += int(e.rows)
	}
	return n
}

// write puts set id's automaton d in a run of rows, its local states
// 1..n at base..base+n-1, and returns the run. An automaton whose start is
// dead (nothing matches) takes no rows.
func (p *dfaRows) write(id uint32, d *l7.DFA) (_ dfaExtent, retErr error) {
	n := uint32(len(d.Next) - 1)
	if d.Start == 0 || n == 0 {
		return dfaExtent{}, nil
	}
	base, err := p.alloc(id, n)
	if err != nil {
		return dfaExtent{}, err
	}
	defer func() {
		if retErr != nil {
			p.release(id)
		}
	}()
	abs := func(s uint16) uint16 {
		if s == 0 {
			return 0
		}
		return uint16(base + uint32(s) - 1)
	}
	if d.Start != 1 {
		return dfaExtent{}, fmt.Errorf("HTTP set %d: automaton starts in state %d, want 1", id, d.Start)
	}
	for s := uint32(1); s <= n; s++ {
		var row l7L7DfaRow
		for c, t := range d.Next[s] {
			row.Next[c] = abs(t)
		}
		row.Accept = d.Accept[s]
		if err := p.m.Put(base+s-1, row); err != nil {
			return dfaExtent{}, fmt.Errorf("HTTP set %d: write automaton row %d: %w", id, base+s-1, err)
		}
	}
	return dfaExtent{base, n}, nil
}

// withoutDFA is k with its automaton's expressions left to user space,
// as if it could not hold them.
func withoutDFA(k *l7.KernelRules) *l7.KernelRules {
	out := *k
	out.AnyPath |= k.PathDFA.Rules
	out.UserSpace |= k.PathDFA.Rules
	out.PathDFA = nil
	return &out
}

package datapath

import (
	"fmt"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/weirnet/weir/internal/l7"
)

// headerWatch keeps the reader's watch list (bpf/lib/http.h
// weir_l7_header_watch): the header names the written sets match on,
// each counted once per set naming it. The reader hashes the values of
// these fields only; a set may be written only once its names are in the
// list, and a name leaves it when the last set naming it is deleted.
type headerWatch struct {
	m    *ebpf.Map
	refs map[uint64]int // name hash: sets naming it
	// held are names an earlier agent's list had, kept until its sets
	// are gone (release): its connections are judged against them.
	held []uint64
	// written is the list as the map holds it.
	written []uint64
}

// errTooManyHeaderNames is a set whose header names would take the
// node's watch list over l7.MaxWatchedHeaders.
var errTooManyHeaderNames = fmt.Errorf("%w: the node's rules would match on more than %d header names", l7.ErrTooManyRules, l7.MaxWatchedHeaders)

// openHeaderWatch takes over m, keeping what an earlier agent wrote in
// it until release.
func openHeaderWatch(m *ebpf.Map) (*headerWatch, error) {
	w := &headerWatch{m: m, refs: map[uint64]int{}}
	var cur l7L7HeaderWatch
	if err := m.Lookup(uint32(0), &cur); err != nil {
		return nil, fmt.Errorf("read the header watch list: %w", err)
	}
	w.held = slices.Clone(cur.Name[:min(int(cur.Count), len(cur.Name))])
	w.written = w.names()
	return w, nil
}

// add counts a set's names in. It changes nothing when they do not fit.
func (w *headerWatch) add(names []l7.KernelHeader) error {
	for _, h := range names {
		w.refs[h.Hash]++
	}
	if err := w.sync(); err != nil {
		w.drop(names)
		return err
	}
	return nil
}

// remove counts a deleted set's names out.
func (w *headerWatch) remove(names []l7.KernelHeader) error {
	w.drop(names)
	return w.sync()
}

// release drops the earlier agent's names, once its sets are deleted.
func (w *headerWatch) release() error {
	w.held = nil
	return w.sync()
}

func (w *headerWatch) drop(names []l7.KernelHeader) {
	for _, h := range names {
		if w.refs[h.Hash]--; w.refs[h.Hash] <= 0 {
			delete(w.refs, h.Hash)
		}
	}
}

// names is the list as it should be: every counted and held name, once,
// in a stable order.
func (w *headerWatch) names() []uint64 {
	out := slices.Clone(w.held)
	for h := range w.refs {
		out = append(out, h)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// sync writes the list when it changed, in one update: the reader sees
// the old one or the new one, never a mix. A list over the map's room is
// not written.
func (w *headerWatch) sync() error {
	names := w.names()
	if slices.Equal(names, w.written) {
		return nil
	}
	var v l7L7HeaderWatch
	if len(names) > len(v.Name) {
		return errTooManyHeaderNames
	}
	copy(v.Name[:], names)
	v.Count = uint32(len(names))
	if err := w.m.Put(uint32(0), v); err != nil {
		return fmt.Errorf("write the header watch list: %w", err)
	}
	w.written = names
	return nil
}

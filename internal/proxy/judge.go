package proxy

import (
	"errors"
	"sync"

	"github.com/weirnet/weir/internal/l7"
)

// SetJudge judges requests with the full matcher of each kernel HTTP set
// (regular expressions included), by the sets' kernel numbers, as lookup
// gives them. A set lookup has no matcher for allows nothing, as a set
// not written does in the kernel.
type SetJudge struct {
	lookup func(set uint32) *l7.Matcher
}

// NewSetJudge judges with the matchers lookup gives.
func NewSetJudge(lookup func(set uint32) *l7.Matcher) *SetJudge {
	return &SetJudge{lookup: lookup}
}

// Judge decides r as l7_judge_sets does, in the sets' order: refused by
// the first set that finds it ambiguous before one allows it, allowed by
// the first that allows it, else denied; sets all 0 allow all.
func (j *SetJudge) Judge(sets [3]uint32, r *l7.Request) Decision {
	if sets == [3]uint32{} {
		return Decision{Verdict: Allow}
	}
	for _, id := range sets {
		if id == 0 {
			continue
		}
		m := j.lookup(id)
		if m == nil {
			continue
		}
		i, err := m.Match(r)
		if errors.Is(err, l7.ErrAmbiguousHeader) {
			return Decision{Verdict: Refuse}
		}
		if i >= 0 {
			return Decision{Verdict: Allow, Set: id, Rule: i}
		}
	}
	return Decision{Verdict: Deny}
}

// HeaderNames are the names the sets' rules match on.
func (j *SetJudge) HeaderNames(sets [3]uint32) []string {
	var names []string
	for _, id := range sets {
		if id == 0 {
			continue
		}
		if m := j.lookup(id); m != nil {
			names = append(names, m.HeaderNames()...)
		}
	}
	return names
}

// Matchers is a table of matchers by kernel set number, safe for
// concurrent use: a SetJudge's lookup for sets written as they come.
type Matchers struct {
	mu   sync.RWMutex
	sets map[uint32]*l7.Matcher
}

// Put gives set id its matcher.
func (t *Matchers) Put(id uint32, m *l7.Matcher) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sets == nil {
		t.sets = map[uint32]*l7.Matcher{}
	}
	t.sets[id] = m
}

// Delete forgets set id.
func (t *Matchers) Delete(id uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.sets, id)
}

// Get is set id's matcher, nil for none.
func (t *Matchers) Get(id uint32) *l7.Matcher {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.sets[id]
}

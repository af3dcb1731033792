package flowstore

import (
	"slices"
	"time"

	"github.com/weirnet/weir/internal/api"
)

// Query selects records. The zero value selects every record held.
type Query struct {
	// Since, if set, drops records last seen before it; Until, if set,
	// those last seen at or after it.
	Since, Until time.Time
	// Match, if set, keeps only the records it returns true for.
	Match func(api.Flow) bool
	// Limit, if positive, keeps only the newest Limit records: the last
	// written, and then the window not yet written.
	Limit int
}

// Query returns the records q selects, oldest first: the segments' from
// the oldest, then the window in memory. It reads the newest segment
// first and stops once it has q.Limit records, so a limited query of a
// full store reads only its last segments. No lock is held while it
// reads, so Add never waits for a query.
func (s *Store) Query(q Query) ([]api.Flow, error) {
	pending, segs := s.snapshot()
	var parts [][]api.Flow // newest first
	n := 0
	take := func(flows []api.Flow) {
		part := q.newest(q.keep(flows), n)
		parts = append(parts, part)
		n += len(part)
	}
	take(pending)
	for i := len(segs) - 1; i >= 0 && !q.full(n); i-- {
		flows, err := s.readSegment(segs[i])
		if err != nil {
			return nil, err
		}
		take(flows)
	}
	out := make([]api.Flow, 0, n)
	for i := len(parts) - 1; i >= 0; i-- {
		out = append(out, parts[i]...)
	}
	return out, nil
}

// snapshot returns the records in memory, in the order they will be
// written, and the segments with the sizes written so far.
func (s *Store) snapshot() ([]api.Flow, []segment) {
	s.mu.Lock()
	flushing, window := values(s.flushing), values(s.window)
	segs := slices.Clone(s.segs)
	s.mu.Unlock()
	slices.SortFunc(flushing, byLastSeen)
	slices.SortFunc(window, byLastSeen)
	return append(flushing, window...), segs
}

func values(m map[key]*api.Flow) []api.Flow {
	out := make([]api.Flow, 0, len(m))
	for _, f := range m {
		out = append(out, *f)
	}
	return out
}

// keep filters flows in place, keeping their order.
func (q Query) keep(flows []api.Flow) []api.Flow {
	return slices.DeleteFunc(flows, func(f api.Flow) bool {
		last := f.LastTime
		if last.IsZero() {
			last = f.Time
		}
		return last.Before(q.Since) || (!q.Until.IsZero() && !last.Before(q.Until)) || (q.Match != nil && !q.Match(f))
	})
}

// newest cuts flows to the newest that still fit in the limit, given
// have records taken already.
func (q Query) newest(flows []api.Flow, have int) []api.Flow {
	if q.Limit > 0 && have+len(flows) > q.Limit {
		return flows[len(flows)-(q.Limit-have):]
	}
	return flows
}

func (q Query) full(have int) bool { return q.Limit > 0 && have >= q.Limit }

package flowstore

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/weirnet/weir/internal/api"
)

// Store is one node's flows: segments on disk and the window being
// aggregated in memory. One Store owns its directory. It is safe for
// concurrent use.
type Store struct {
	dir  string
	opts Options

	// mu guards the fields below it. It is held for map updates and
	// bookkeeping, never for file I/O, so Add never waits for the disk.
	mu       sync.Mutex
	window   map[key]*api.Flow
	flushing map[key]*api.Flow // the window being written, which Query still sees
	segs     []segment         // oldest first; the last may be the active one
	bytes    int64             // the sum of segs' sizes
	stats    Stats
	closed   bool

	// writeMu serialises writers and guards the fields below it.
	writeMu sync.Mutex
	active  *os.File // the last of segs; nil: the next write starts a segment
	nextSeq uint64

	kick      chan struct{} // a full window asks the writer to write it now
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// Stats are a store's sizes and counters, for metrics. Counters start at
// zero when the store is opened.
type Stats struct {
	Bytes    int64 // in segments on disk
	Segments int
	Pending  int    // records in memory, not yet written
	Flows    uint64 // records written
	// DroppedSegments and DroppedBytes were deleted, oldest first, to
	// stay within MaxBytes.
	DroppedSegments uint64
	DroppedBytes    uint64
	// TornLines are lines found at Open that a crash cut short; queries
	// skip them.
	TornLines uint64
	// WriteErrors are failed writes; each loses its window.
	WriteErrors uint64
}

// Open opens the store in dir, creating the directory if needed, and
// starts the background writer; Close stops it. Segments an earlier run
// left are kept and queried, and new ones continue their sequence.
func Open(dir string, opts Options) (*Store, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("open flow store %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create flow store directory: %w", err)
	}
	segs, torn, err := findSegments(dir)
	if err != nil {
		return nil, fmt.Errorf("open flow store %s: %w", dir, err)
	}
	s := &Store{
		dir: dir, opts: o, window: map[key]*api.Flow{}, segs: segs, nextSeq: 1,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	s.stats.TornLines = torn
	for _, seg := range segs {
		s.bytes += seg.size
	}
	if len(segs) > 0 {
		s.nextSeq = segs[len(segs)-1].seq + 1
	}
	// A bound lowered since the last run applies at once.
	s.mu.Lock()
	dropped := s.dropOldestLocked(0)
	s.mu.Unlock()
	if err := s.removeSegments(dropped); err != nil {
		return nil, fmt.Errorf("open flow store %s: %w", dir, err)
	}
	go s.run()
	return s, nil
}

// Add counts a flow into the current window: a map update under a
// mutex, with no I/O, so it can be called for every flow. After Close it
// does nothing.
func (s *Store) Add(f api.Flow) {
	k := keyOf(f)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if agg, ok := s.window[k]; ok {
		merge(agg, f, s.opts.Now)
		return
	}
	s.window[k] = newAggregate(f, k, s.opts.Now)
	if len(s.window) >= s.opts.MaxWindowFlows {
		select {
		case s.kick <- struct{}{}:
		default: // already asked
		}
	}
}

// Flush writes the current window now and starts a new one. The
// background writer calls it every Window, and Close calls it last.
func (s *Store) Flush() error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	return s.flushLocked()
}

// Close writes the window in memory and stops the background writer;
// flows added later are dropped. Later calls return the first's result.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.stop)
		<-s.done
		s.writeMu.Lock()
		defer s.writeMu.Unlock()
		err := s.flushLocked()
		if s.active != nil {
			err = errors.Join(err, s.closeActive())
		}
		s.closeErr = err
	})
	return s.closeErr
}

// Stats returns the store's sizes and counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Bytes, st.Segments = s.bytes, len(s.segs)
	st.Pending = len(s.window) + len(s.flushing)
	return st
}

// run is the background writer: a window ends every Window, or early
// when it is full.
func (s *Store) run() {
	defer close(s.done)
	t := time.NewTicker(s.opts.Window)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		case <-s.kick:
		}
		if err := s.Flush(); err != nil && s.opts.OnError != nil {
			s.opts.OnError(err)
		}
	}
}

// flushLocked writes the window with one write call; s.writeMu is held.
// The write is not synced: see the package documentation.
func (s *Store) flushLocked() error {
	window := s.takeWindow()
	if len(window) == 0 {
		return nil
	}
	flows := sortedFlows(window)
	n, err := s.writeFlows(flows)
	dropped, full := s.commit(len(flows), n, err)
	// After a failed write the segment may end in a torn line; a new
	// one keeps the next window's first line whole.
	if s.active != nil && (err != nil || full) {
		err = errors.Join(err, s.closeActive())
	}
	return errors.Join(err, s.removeSegments(dropped))
}

// takeWindow starts a new window and returns the old one, which stays
// visible to Query until commit.
func (s *Store) takeWindow() map[key]*api.Flow {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.window
	if len(w) == 0 {
		return nil
	}
	s.window, s.flushing = map[key]*api.Flow{}, w
	return w
}

func sortedFlows(window map[key]*api.Flow) []api.Flow {
	flows := make([]api.Flow, 0, len(window))
	for _, f := range window {
		flows = append(flows, *f)
	}
	slices.SortFunc(flows, byLastSeen)
	return flows
}

// writeFlows appends flows to the active segment, starting one if there
// is none, and returns how many bytes reached it.
func (s *Store) writeFlows(flows []api.Flow) (int, error) {
	buf, err := encodeLines(flows)
	if err != nil {
		return 0, err
	}
	if s.active == nil {
		if err := s.startSegment(); err != nil {
			return 0, err
		}
	}
	n, err := s.active.Write(buf)
	if err != nil {
		return n, fmt.Errorf("write flow segment: %w", err)
	}
	return n, nil
}

// commit books a write of n bytes holding records flows and ends the
// window's time as pending, in one step, so a query sees the window in
// memory or on disk but never both or neither. It takes the oldest
// segments off the list while the total is above MaxBytes and returns
// them to delete, and reports whether the active segment is full.
func (s *Store) commit(records, n int, err error) (dropped []segment, full bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushing = nil
	if err != nil {
		s.stats.WriteErrors++
	} else {
		s.stats.Flows += uint64(records)
	}
	if n > 0 {
		s.segs[len(s.segs)-1].size += int64(n)
		s.bytes += int64(n)
	}
	if len(s.segs) > 0 {
		full = s.segs[len(s.segs)-1].size >= s.opts.SegmentBytes
	}
	return s.dropOldestLocked(1), full
}

// dropOldestLocked takes the oldest segments off the list while the total
// is above MaxBytes, keeping the newest keep; s.mu is held.
func (s *Store) dropOldestLocked(keep int) []segment {
	var dropped []segment
	for s.bytes > s.opts.MaxBytes && len(s.segs) > keep {
		seg := s.segs[0]
		s.segs = s.segs[1:]
		s.bytes -= seg.size
		s.stats.DroppedSegments++
		s.stats.DroppedBytes += uint64(seg.size)
		dropped = append(dropped, seg)
	}
	return dropped
}

// startSegment creates the next segment and makes it the active one;
// s.writeMu is held.
func (s *Store) startSegment() error {
	seq := s.nextSeq
	// Past this number even on failure: a name that exists must not stop
	// every later write.
	s.nextSeq++
	f, err := os.OpenFile(s.segmentPath(seq), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("start flow segment: %w", err)
	}
	s.active = f
	s.mu.Lock()
	s.segs = append(s.segs, segment{seq: seq})
	s.mu.Unlock()
	return nil
}

// closeActive syncs and closes the active segment; s.writeMu is held.
// Syncing here, once a segment, bounds what a power loss can take
// without a sync on every window.
func (s *Store) closeActive() error {
	f := s.active
	s.active = nil
	err := f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("close flow segment: %w", err)
	}
	return nil
}

// removeSegments deletes segments already taken off the list.
func (s *Store) removeSegments(segs []segment) error {
	var errs []error
	for _, seg := range segs {
		if err := os.Remove(s.segmentPath(seg.seq)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("delete flow segment: %w", err))
		}
	}
	return errors.Join(errs...)
}

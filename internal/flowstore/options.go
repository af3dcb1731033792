package flowstore

import (
	"errors"
	"fmt"
	"time"
)

// Defaults for the zero fields of Options.
const (
	DefaultMaxBytes       = 64 << 20
	DefaultSegmentBytes   = 4 << 20
	DefaultWindow         = 5 * time.Second
	DefaultMaxWindowFlows = 16384
)

// ErrInvalidOptions is returned by Open for options it cannot work with;
// the message names the option and what to change.
var ErrInvalidOptions = errors.New("invalid flow store options")

// Options tune a Store. The zero value is usable: every zero field takes
// its default.
type Options struct {
	// MaxBytes bounds the segments on disk: after each write the oldest
	// are deleted while the total is above it. The newest segment is
	// never deleted, so one window larger than MaxBytes is kept whole.
	MaxBytes int64
	// SegmentBytes is the size at which the active segment is closed and
	// the next window starts a new one; it is the unit of deletion. Zero:
	// DefaultSegmentBytes, or an eighth of MaxBytes when that is smaller,
	// so a small store still drops its history a little at a time.
	SegmentBytes int64
	// Window is how long flows are aggregated in memory before they are
	// written, and so the most a crash loses.
	Window time.Duration
	// MaxWindowFlows is how many records a window may hold before it is
	// written early. Flows that rarely repeat (a port scan) would
	// otherwise grow a window without bound.
	MaxWindowFlows int
	// Now gives the time of flows added without one. Nil: time.Now.
	Now func() time.Time
	// OnError, if set, is told of the background writer's failures. They
	// are counted in Stats either way.
	OnError func(error)
}

// withDefaults fills in the zero fields and rejects what cannot work.
func (o Options) withDefaults() (Options, error) {
	if err := o.checkSigns(); err != nil {
		return o, err
	}
	if o.MaxBytes == 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.SegmentBytes == 0 {
		o.SegmentBytes = min(DefaultSegmentBytes, max(o.MaxBytes/8, 1))
	}
	if o.SegmentBytes > o.MaxBytes {
		return o, fmt.Errorf("Options.SegmentBytes %d is above Options.MaxBytes %d: lower SegmentBytes or raise MaxBytes: %w",
			o.SegmentBytes, o.MaxBytes, ErrInvalidOptions)
	}
	if o.Window == 0 {
		o.Window = DefaultWindow
	}
	if o.MaxWindowFlows == 0 {
		o.MaxWindowFlows = DefaultMaxWindowFlows
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o, nil
}

// checkSigns rejects negative sizes and durations, which have no meaning.
func (o Options) checkSigns() error {
	switch {
	case o.MaxBytes < 0:
		return fmt.Errorf("Options.MaxBytes %d is negative: want a size in bytes, or 0 for %d: %w", o.MaxBytes, DefaultMaxBytes, ErrInvalidOptions)
	case o.SegmentBytes < 0:
		return fmt.Errorf("Options.SegmentBytes %d is negative: want a size in bytes, or 0 for the default: %w", o.SegmentBytes, ErrInvalidOptions)
	case o.Window < 0:
		return fmt.Errorf("Options.Window %v is negative: want a duration, or 0 for %v: %w", o.Window, DefaultWindow, ErrInvalidOptions)
	case o.MaxWindowFlows < 0:
		return fmt.Errorf("Options.MaxWindowFlows %d is negative: want a count, or 0 for %d: %w", o.MaxWindowFlows, DefaultMaxWindowFlows, ErrInvalidOptions)
	}
	return nil
}

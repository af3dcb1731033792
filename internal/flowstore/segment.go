package flowstore

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/weirnet/weir/internal/api"
)

// segmentExt ends every segment's name; the rest is the sequence number,
// zero-padded so a directory listing sorts oldest first.
const segmentExt = ".jsonl"

// segment is one file of JSON lines. size is what has been written to it
// (its file size when found at Open): readers read no further, so they
// never see a write still under way.
type segment struct {
	seq  uint64
	size int64
}

func segmentName(seq uint64) string { return fmt.Sprintf("%012d%s", seq, segmentExt) }

func (s *Store) segmentPath(seq uint64) string { return filepath.Join(s.dir, segmentName(seq)) }

// parseSegmentName returns the sequence number of a segment's file name;
// other files in the directory are not the store's and are left alone.
func parseSegmentName(name string) (uint64, bool) {
	digits, ok := strings.CutSuffix(name, segmentExt)
	if !ok || digits == "" {
		return 0, false
	}
	seq, err := strconv.ParseUint(digits, 10, 64)
	return seq, err == nil
}

// findSegments lists the segments a previous run left, oldest first, and
// counts those whose last line a crash cut short.
func findSegments(dir string) (segs []segment, torn uint64, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, 0, fmt.Errorf("list flow segments: %w", err)
	}
	for _, e := range entries {
		seq, ok := parseSegmentName(e.Name())
		if !ok || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return nil, 0, fmt.Errorf("flow segment %s: %w", e.Name(), err)
		}
		isTorn, err := hasTornTail(filepath.Join(dir, e.Name()), info.Size())
		if err != nil {
			return nil, 0, err
		}
		if isTorn {
			torn++
		}
		segs = append(segs, segment{seq: seq, size: info.Size()})
	}
	slices.SortFunc(segs, func(a, b segment) int { return cmp.Compare(a.seq, b.seq) })
	return segs, torn, nil
}

// hasTornTail reports whether a segment does not end in a newline: a
// write the crash of an earlier run cut short. The store never appends to
// an earlier run's segment, so the torn line stays last, and is skipped.
func hasTornTail(path string, size int64) (bool, error) {
	if size == 0 {
		return false, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return false, fmt.Errorf("open flow segment: %w", err)
	}
	defer f.Close()
	last := make([]byte, 1)
	if _, err := f.ReadAt(last, size-1); err != nil {
		return false, fmt.Errorf("read flow segment %s: %w", path, err)
	}
	return last[0] != '\n', nil
}

// readSegment returns the flows of a segment's first size bytes, oldest
// first. A segment deleted since the caller listed it holds none.
func (s *Store) readSegment(seg segment) ([]api.Flow, error) {
	f, err := os.Open(s.segmentPath(seg.seq))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open flow segment: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.NewSectionReader(f, 0, seg.size))
	if err != nil {
		return nil, fmt.Errorf("read flow segment %s: %w", f.Name(), err)
	}
	return decodeLines(data), nil
}

// decodeLines decodes one flow per line. A line that does not decode (the
// torn end of a segment, or damage) is skipped: one bad record must not
// hide the rest of a node's history.
func decodeLines(data []byte) []api.Flow {
	var flows []api.Flow
	for len(data) > 0 {
		line, rest, found := bytes.Cut(data, []byte{'\n'})
		data = rest
		if !found {
			break // torn: its write never finished
		}
		var f api.Flow
		if json.Unmarshal(line, &f) == nil {
			flows = append(flows, f)
		}
	}
	return flows
}

// encodeLines renders flows as JSON lines, for one write call.
func encodeLines(flows []api.Flow) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, f := range flows {
		if err := enc.Encode(f); err != nil {
			return nil, fmt.Errorf("encode flow: %w", err)
		}
	}
	return buf.Bytes(), nil
}

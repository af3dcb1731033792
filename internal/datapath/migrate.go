package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// An upgrade loads this version's programs while the previous version's
// still run: its links are pinned, and its maps, pinned by name, hold the
// node's connections, translations and policy. A map whose definition is
// unchanged is simply reused. One that changed cannot be: the kernel
// keeps a map's type and sizes for life, and the loader would refuse the
// pin. What happens then is decided here, for every map before any pin is
// touched, so a refused upgrade changes nothing:
//
//   - resized (only the entry limit or flags differ, same type, key and
//     value, and the entries fit): a new map is made and every entry
//     copied into it.
//   - counters and event queues (mapsToReset): made anew, empty; what is
//     lost is counts (a counter reset) and undelivered events.
//   - widened (a struct value that gained members at its end, the same
//     type and key, the old value's layout equal to the new one's up to
//     the old size, as recorded, or as the old map's own BTF describes
//     it for a version that recorded none): a new map is made and every
//     entry copied into it, the new members zero. A member appended to a pinned map's
//     value must therefore mean "as before" at zero (policy_entry's http:
//     no HTTP restriction).
//   - anything else (another type, key or value size, the same sizes laid
//     out differently, or more entries than the new limit): refused with
//     ErrMapLayout, naming each map and what changed. Replacing it would
//     lose entries the running datapath depends on mid-flight; the error
//     says how to upgrade instead.
//
// The new maps are unpinned while the programs load (MapReplacements), so
// a load that fails leaves every pin as it was. Only once every object
// loaded is each new map swapped in for the old pin (a rename exchange,
// never a moment without one), and the old one kept at "<name>:old" until
// finish: once every link runs the new programs, the entries the old ones
// created meanwhile in the maps only programs write are copied over, and
// the old pins go. An agent stopped in between finds the ":old" pins at
// its next start and finishes then.
//
// Whether a value is laid out differently at the same size is told by a
// fingerprint of its BTF type's shape (member offsets, sizes and kinds,
// not names), recorded for every map in a pinned map of its own
// (weir_map_layouts) after each successful load. Pins written by a
// version without that record are compared by their sizes alone.

// ErrMapLayout: a pinned map's definition changed in a way this version
// cannot carry over in place.
var ErrMapLayout = errors.New("pinned maps of an earlier version cannot be taken over in place")

// layoutsMapName is the pinned map recording each map's shape fingerprint.
const layoutsMapName = "weir_map_layouts"

// oldPinSuffix marks the pin of a map replaced by a migration, kept until
// it finishes (bpffs refuses dots in names).
const oldPinSuffix = ":old"

// newPinSuffix marks a replacement pinned beside the map it replaces, for
// the moment before they swap.
const newPinSuffix = ":new"

// mapsToReset hold counts or undelivered events: made anew when their
// definition changes, with the reason it is safe.
var mapsToReset = map[string]string{
	"weir_events":         "undelivered flow events",
	"weir_metrics":        "packet counters (a counter reset)",
	"weir_verdicts":       "verdict counters (a counter reset)",
	"weir_l7_events":      "undelivered request records",
	"weir_l7_stats":       "L7 counters (a counter reset)",
	"weir_l7_handoff":     "hand-off records, which a starting proxy clears anyway (L7Proxy.Reset): connections handed before the upgrade close",
	"weir_lb4_flow_socks": "the flow notes of sockets opened before the upgrade are left to their map's LRU",
}

// programWritten are maps the datapath writes itself, per packet or per
// socket: entries the old programs create while the new ones load are
// copied again once the links moved. The agent's own maps are not: it
// rewrites them, and copying again could bring back an entry it deleted.
var programWritten = map[string]bool{
	"weir_ct": true, "weir_ct_any": true, "weir_ct_revoked": true, "weir_frags": true,
	"weir_lb4_revnat": true, "weir_lb4_affinity": true, "weir_lb4_flows": true,
	"weir_lb4_nat_fwd": true, "weir_lb4_nat_rev": true, "weir_lb4_frags": true,
}

// migrationStep is what a migration does to one pinned map.
type migrationStep struct {
	name string
	spec *ebpf.MapSpec
	old  *ebpf.Map
	copy bool // carry the entries over; otherwise start it empty
	// fresh is the new map (prepared), unpinned until commit.
	fresh *ebpf.Map
	// widened: the old values are shorter, copied with zeroes after.
	widened bool
	// seen are the keys copied at preparation, of a program-written map:
	// finish copies only keys created after, so an entry the new programs
	// deleted meanwhile stays deleted.
	seen map[string]bool
	n    int // entries copied
}

// pinMigration is a migration of pinDir's maps: prepared, committed once
// the programs loaded, finished once every link moved.
type pinMigration struct {
	pinDir string
	steps  []*migrationStep
	// leftover are ":old" pins an earlier start committed but did not
	// finish.
	leftover []*migrationStep
	notes    []string // what was done, for the log
}

// planMigration decides, for every map of specs pinned in pinDir, what an
// upgrade does with it, touching nothing: the steps for the maps that
// changed (their old maps open), or ErrMapLayout naming every map that
// cannot be taken over.
func planMigration(pinDir string, specs []*ebpf.CollectionSpec) (_ []*migrationStep, retErr error) {
	specsByName := pinnedSpecs(specs)
	layouts, err := readLayouts(pinDir)
	if err != nil {
		return nil, err
	}
	var (
		steps   []*migrationStep
		refused []string
	)
	defer func() {
		if retErr != nil {
			closeSteps(steps)
		}
	}()
	for _, name := range slices.Sorted(maps.Keys(specsByName)) {
		spec := specsByName[name]
		old, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("pinned map %s: %w", name, err)
		}
		sizes := spec.Compatible(old)
		shape, recorded := layouts[name]
		sameShape := !recorded || shape == layoutOf(spec)
		var why string
		switch {
		case sizes == nil && sameShape:
			old.Close()
			continue
		case mapsToReset[name] != "":
			steps = append(steps, &migrationStep{name: name, spec: spec, old: old})
			continue
		case sameShape && resizable(old, spec):
			if why, err = fits(old, spec); err != nil {
				old.Close()
				return nil, fmt.Errorf("pinned map %s: %w", name, err)
			}
			if why == "" {
				steps = append(steps, &migrationStep{name: name, spec: spec, old: old, copy: true})
				continue
			}
		case widenable(old, spec, shape, recorded):
			if why, err = fits(old, spec); err != nil {
				old.Close()
				return nil, fmt.Errorf("pinned map %s: %w", name, err)
			}
			if why == "" {
				steps = append(steps, &migrationStep{name: name, spec: spec, old: old, copy: true, widened: true})
				continue
			}
		case sizes != nil:
			why = strings.TrimSuffix(sizes.Error(), ": "+ebpf.ErrMapIncompatible.Error())
		default:
			why = "its key or value is laid out differently at the same size"
		}
		refused = append(refused, fmt.Sprintf("%s (%s)", name, why))
		old.Close()
	}
	if len(refused) > 0 {
		return nil, fmt.Errorf("%w: %s in %s. This version has no conversion for their entries, and starting them empty would "+
			"lose what the running datapath holds (connections, translations, policy). Upgrade this node out of place: drain it, "+
			"run `weir-agent uninstall` on it (or `weir uninstall` for the cluster), then start this version", ErrMapLayout, strings.Join(refused, "; "), pinDir)
	}
	return steps, nil
}

// fits says why old's entries do not fit a map made from spec ("" when
// they do): a hash map or trie holding more than its new limit (an LRU
// map evicts instead), an array with values past its new end.
func fits(old *ebpf.Map, spec *ebpf.MapSpec) (string, error) {
	if spec.MaxEntries >= old.MaxEntries() || spec.Type == ebpf.LRUHash {
		return "", nil
	}
	key := make([]byte, old.KeySize())
	value := make([]byte, old.ValueSize())
	n := 0
	err := iterateRetrying(old, key, value, func() error {
		if spec.Type == ebpf.Array {
			if i := binary.NativeEndian.Uint32(key); i >= spec.MaxEntries && !allZero(value) {
				return fmt.Errorf("%w: index %d", errNoFit, i)
			}
			return nil
		}
		n++
		return nil
	}, func() { n = 0 })
	switch {
	case errors.Is(err, errNoFit):
		return fmt.Sprintf("it holds values past %d, this version's end", spec.MaxEntries), nil
	case err != nil:
		return "", err
	case uint32(n) > spec.MaxEntries:
		return fmt.Sprintf("it holds %d entries, this version's at most %d", n, spec.MaxEntries), nil
	}
	return "", nil
}

var errNoFit = errors.New("does not fit")

func closeSteps(steps []*migrationStep) {
	for _, s := range steps {
		if s.old != nil {
			s.old.Close()
		}
		if s.fresh != nil {
			s.fresh.Close()
		}
	}
}

// CheckPins says whether this version's programs can take over the maps
// pinned in pinDir in place (nil, also when there are none), or why not
// (ErrMapLayout), changing nothing: what an upgrade is checked with before
// any agent is replaced.
func CheckPins(pinDir string) error {
	specs, err := entrySpecs()
	if err != nil {
		return err
	}
	steps, err := planMigration(pinDir, specs.all())
	closeSteps(steps)
	return err
}

// prepareMigration plans pinDir's migration and fills the new maps,
// leaving every pin as it is (but for putting back a swap an earlier start
// left half done).
func prepareMigration(pinDir string, specs []*ebpf.CollectionSpec) (_ *pinMigration, retErr error) {
	mig := &pinMigration{pinDir: pinDir}
	defer func() {
		if retErr != nil {
			mig.close()
		}
	}()
	if err := mig.recoverLeftovers(specs); err != nil {
		return nil, err
	}
	steps, err := planMigration(pinDir, specs)
	if err != nil {
		return nil, err
	}
	mig.steps = steps
	for _, s := range steps {
		fresh := s.spec.Copy()
		fresh.Pinning = ebpf.PinNone
		if s.fresh, err = ebpf.NewMap(fresh); err != nil {
			return nil, fmt.Errorf("map %s for this version: %w", s.name, err)
		}
		if !s.copy {
			continue
		}
		if programWritten[s.name] {
			s.seen = map[string]bool{}
		}
		if s.n, err = copyEntries(s.old, s.fresh, s.seen); err != nil {
			return nil, fmt.Errorf("carry pinned map %s over: %w", s.name, err)
		}
	}
	return mig, nil
}

// recoverLeftovers deals with the pins of an earlier start's migration:
// a replacement never swapped in is dropped; a swap cut in two (the old
// map moved aside, the new not yet in place) is undone; an old map whose
// replacement is in place is kept for finish.
func (m *pinMigration) recoverLeftovers(specs []*ebpf.CollectionSpec) error {
	for name := range pinnedSpecs(specs) {
		path := filepath.Join(m.pinDir, name)
		if err := os.Remove(path + newPinSuffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove an unfinished replacement of %s: %w", name, err)
		}
		if _, err := os.Stat(path + oldPinSuffix); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			if err := os.Rename(path+oldPinSuffix, path); err != nil {
				return fmt.Errorf("put back %s: %w", name, err)
			}
			continue
		}
		old, err := ebpf.LoadPinnedMap(path+oldPinSuffix, nil)
		if err != nil {
			return fmt.Errorf("pinned map %s: %w", name+oldPinSuffix, err)
		}
		m.leftover = append(m.leftover, &migrationStep{name: name, old: old, copy: true})
	}
	return nil
}

// replacements are the new maps of the migration spec's object uses.
func (m *pinMigration) replacements(spec *ebpf.CollectionSpec) map[string]*ebpf.Map {
	if m == nil {
		return nil
	}
	out := map[string]*ebpf.Map{}
	for _, s := range m.steps {
		if _, ok := spec.Maps[s.name]; ok {
			out[s.name] = s.fresh
		}
	}
	return out
}

// commit swaps every new map in for its old pin, once the programs
// loaded with them. The old map of a reset one goes at once; a copied
// one's stays at "<name>:old" until finish.
func (m *pinMigration) commit() error {
	for _, s := range m.steps {
		path := filepath.Join(m.pinDir, s.name)
		if err := s.fresh.Pin(path + newPinSuffix); err != nil {
			return fmt.Errorf("pin map %s: %w", s.name, err)
		}
		if err := swapPins(path+newPinSuffix, path); err != nil {
			return fmt.Errorf("replace pinned map %s: %w", s.name, err)
		}
		// What was the new map's pin is the old map's now.
		if err := os.Rename(path+newPinSuffix, path+oldPinSuffix); err != nil {
			return fmt.Errorf("move the old %s aside: %w", s.name, err)
		}
		if !s.copy {
			if err := os.Remove(path + oldPinSuffix); err != nil {
				return fmt.Errorf("remove the old %s: %w", s.name, err)
			}
			m.notes = append(m.notes, fmt.Sprintf("%s made anew: %s", s.name, mapsToReset[s.name]))
			continue
		}
		if s.widened {
			m.notes = append(m.notes, fmt.Sprintf("%s carried over (%d entries, values widened from %d to %d bytes, the new members zero)",
				s.name, s.n, s.old.ValueSize(), s.spec.ValueSize))
			continue
		}
		m.notes = append(m.notes, fmt.Sprintf("%s carried over (%d entries, limit %d to %d)", s.name, s.n, s.old.MaxEntries(), s.spec.MaxEntries))
	}
	return nil
}

// swapPins exchanges two pins in one step where bpffs can (never a moment
// without the pin at b), and moves b aside then a into place where not.
func swapPins(a, b string) error {
	err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE)
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) {
		return err
	}
	tmp := b + oldPinSuffix
	if err := os.Rename(b, tmp); err != nil {
		return err
	}
	if err := os.Rename(a, b); err != nil {
		return errors.Join(err, os.Rename(tmp, b))
	}
	return os.Rename(tmp, a)
}

// finish copies into the new program-written maps the entries the old
// programs created after they were copied, once no program uses the old
// maps any more (every link moved), and removes the old pins. It returns
// how many entries that was.
func (m *pinMigration) finish() (int, error) {
	if m == nil {
		return 0, nil
	}
	defer m.close()
	var (
		total int
		errs  []error
	)
	for _, s := range append(append([]*migrationStep{}, m.steps...), m.leftover...) {
		if !s.copy {
			continue
		}
		path := filepath.Join(m.pinDir, s.name)
		if programWritten[s.name] {
			now, err := ebpf.LoadPinnedMap(path, nil)
			if err != nil {
				errs = append(errs, fmt.Errorf("map %s: %w", s.name, err))
				continue
			}
			n, err := copyNew(s.old, now, s.seen)
			now.Close()
			total += n
			if err != nil {
				errs = append(errs, fmt.Errorf("map %s: %w", s.name, err))
				continue
			}
		}
		if err := os.Remove(path + oldPinSuffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove the old %s: %w", s.name, err))
		}
	}
	return total, errors.Join(errs...)
}

// close lets every map the migration holds go; pins stay as they are.
func (m *pinMigration) close() {
	if m == nil {
		return
	}
	closeSteps(m.steps)
	closeSteps(m.leftover)
	m.steps, m.leftover = nil, nil
}

// widenable: old's values are spec's struct cut short at old's value size,
// told by old's recorded shape (or, with none recorded, by its own BTF),
// so each entry can be copied with zeroes after it.
func widenable(old *ebpf.Map, spec *ebpf.MapSpec, shape uint64, recorded bool) bool {
	if old.Type() != spec.Type || old.KeySize() != spec.KeySize || old.ValueSize() >= spec.ValueSize {
		return false
	}
	switch spec.Type {
	case ebpf.Hash, ebpf.LRUHash, ebpf.LPMTrie, ebpf.Array:
	default:
		return false
	}
	if !recorded {
		if shape, recorded = btfLayout(old, spec); !recorded {
			return false
		}
	}
	cut, ok := valuePrefix(spec, old.ValueSize())
	return ok && layoutOf(cut) == shape
}

// btfLayout fingerprints old's shape from the BTF it was created with:
// its key and value types are found by the names spec gives them, and
// must have old's sizes. ok is false when old carries no BTF or lacks
// such types.
func btfLayout(old *ebpf.Map, spec *ebpf.MapSpec) (_ uint64, ok bool) {
	info, err := old.Info()
	if err != nil {
		return 0, false
	}
	id, ok := info.BTFID()
	if !ok {
		return 0, false
	}
	h, err := btf.NewHandleFromID(id)
	if err != nil {
		return 0, false
	}
	defer h.Close()
	types, err := h.Spec(nil)
	if err != nil {
		return 0, false
	}
	find := func(t btf.Type, size uint32) btf.Type {
		if t == nil || t.TypeName() == "" {
			return nil
		}
		found, err := types.AnyTypeByName(t.TypeName())
		if err != nil {
			return nil
		}
		if n, err := btf.Sizeof(found); err != nil || uint32(n) != size {
			return nil
		}
		return found
	}
	key, value := find(spec.Key, old.KeySize()), find(spec.Value, old.ValueSize())
	if key == nil || value == nil {
		return 0, false
	}
	return layoutOf(&ebpf.MapSpec{Type: old.Type(), Key: key, Value: value}), true
}

// valuePrefix is spec with its struct value cut to its first size bytes:
// the members that end by then. ok is false when the value is no struct
// or a member straddles the cut.
func valuePrefix(spec *ebpf.MapSpec, size uint32) (_ *ebpf.MapSpec, ok bool) {
	st, isStruct := btf.UnderlyingType(spec.Value).(*btf.Struct)
	if !isStruct {
		return nil, false
	}
	cut := &btf.Struct{Name: st.Name, Size: size}
	for _, m := range st.Members {
		msize, err := btf.Sizeof(m.Type)
		if err != nil {
			return nil, false
		}
		start := m.Offset.Bytes()
		switch {
		case start+uint32(msize) <= size:
			cut.Members = append(cut.Members, m)
		case start < size:
			return nil, false
		}
	}
	out := spec.Copy()
	out.Value, out.ValueSize = cut, size
	return out, true
}

// resizable: old can be copied entry by entry into a map made from spec.
func resizable(old *ebpf.Map, spec *ebpf.MapSpec) bool {
	if old.Type() != spec.Type || old.KeySize() != spec.KeySize || old.ValueSize() != spec.ValueSize {
		return false
	}
	switch spec.Type {
	case ebpf.Hash, ebpf.LRUHash, ebpf.LPMTrie, ebpf.Array:
		return true
	}
	return false
}

// copyEntries copies from's entries into to, recording their keys in seen
// (if not nil), and returns how many it copied. An array's indexes past
// to's end were checked to hold zeroes (fits).
func copyEntries(from, to *ebpf.Map, seen map[string]bool) (int, error) {
	key := make([]byte, from.KeySize())
	value := make([]byte, from.ValueSize())
	n := 0
	wide := make([]byte, to.ValueSize())
	err := iterateRetrying(from, key, value, func() error {
		if from.Type() == ebpf.Array && binary.NativeEndian.Uint32(key) >= to.MaxEntries() {
			return nil
		}
		copy(wide, value) // zeroes after a widened value's old end
		if err := to.Put(key, wide); err != nil {
			return fmt.Errorf("entry %d: %w", n+1, err)
		}
		if seen != nil {
			seen[string(key)] = true
		}
		n++
		return nil
	}, func() { n = 0 })
	return n, err
}

// copyNew copies into to the entries of from whose keys are not in seen
// and that to lacks: created by the old programs after the first copy.
// An entry the new programs created meanwhile is never overwritten.
func copyNew(from, to *ebpf.Map, seen map[string]bool) (int, error) {
	key := make([]byte, from.KeySize())
	value := make([]byte, from.ValueSize())
	n := 0
	wide := make([]byte, to.ValueSize())
	err := iterateRetrying(from, key, value, func() error {
		if seen[string(key)] {
			return nil
		}
		copy(wide, value)
		err := to.Update(key, wide, ebpf.UpdateNoExist)
		switch {
		case err == nil:
			n++
		case errors.Is(err, ebpf.ErrKeyExist):
		default:
			return err
		}
		return nil
	}, func() {})
	return n, err
}

// iterateRetrying runs each for every entry of m, read into key and
// value; an iteration the programs' deletions aborted (a map still in
// use) starts over, after restart, up to three times.
func iterateRetrying(m *ebpf.Map, key, value []byte, each func() error, restart func()) error {
	for try := 0; ; try++ {
		it := m.Iterate()
		for it.Next(key, value) {
			if err := each(); err != nil {
				return err
			}
		}
		err := it.Err()
		if !errors.Is(err, ebpf.ErrIterationAborted) || try == 2 {
			return err
		}
		restart()
	}
}

// pinnedSpecs are the maps pinned by name across specs, by name.
func pinnedSpecs(specs []*ebpf.CollectionSpec) map[string]*ebpf.MapSpec {
	out := map[string]*ebpf.MapSpec{}
	for _, cs := range specs {
		for _, ms := range cs.Maps {
			if ms.Pinning == ebpf.PinByName {
				if _, ok := out[ms.Name]; !ok {
					out[ms.Name] = ms
				}
			}
		}
	}
	return out
}

// layoutOf fingerprints a map's shape: its type and the shapes of its key
// and value (sizes, offsets and kinds; names left out, so renaming a field
// is no change).
func layoutOf(spec *ebpf.MapSpec) uint64 {
	var b strings.Builder
	fmt.Fprintf(&b, "%v|", spec.Type)
	describeShape(&b, spec.Key, 0)
	b.WriteString("|")
	describeShape(&b, spec.Value, 0)
	h := fnv.New64a()
	h.Write([]byte(b.String()))
	return h.Sum64()
}

func describeShape(b *strings.Builder, t btf.Type, depth int) {
	if depth > 16 {
		b.WriteString("...")
		return
	}
	switch t := t.(type) {
	case nil:
		b.WriteString("-")
	case *btf.Typedef:
		describeShape(b, t.Type, depth+1)
	case *btf.Const:
		describeShape(b, t.Type, depth+1)
	case *btf.Volatile:
		describeShape(b, t.Type, depth+1)
	case *btf.Restrict:
		describeShape(b, t.Type, depth+1)
	case *btf.TypeTag:
		describeShape(b, t.Type, depth+1)
	case *btf.Float:
		fmt.Fprintf(b, "f%d", t.Size)
	case *btf.Int:
		fmt.Fprintf(b, "i%d", t.Size)
		if t.Encoding&btf.Signed != 0 {
			b.WriteString("s")
		}
	case *btf.Enum:
		fmt.Fprintf(b, "e%d", t.Size)
	case *btf.Pointer:
		b.WriteString("p")
	case *btf.Array:
		fmt.Fprintf(b, "[%d]", t.Nelems)
		describeShape(b, t.Type, depth+1)
	case *btf.Struct:
		describeMembers(b, "s", t.Size, t.Members, depth)
	case *btf.Union:
		describeMembers(b, "u", t.Size, t.Members, depth)
	default:
		size, _ := btf.Sizeof(t)
		fmt.Fprintf(b, "%T%d", t, size)
	}
}

func describeMembers(b *strings.Builder, kind string, size uint32, members []btf.Member, depth int) {
	fmt.Fprintf(b, "%s%d{", kind, size)
	for _, m := range members {
		fmt.Fprintf(b, "%d:%d:", m.Offset, m.BitfieldSize)
		describeShape(b, m.Type, depth+1)
		b.WriteString(";")
	}
	b.WriteString("}")
}

// layoutKey is a map name as the layouts map's key (pin names are not
// held to the kernel's 16 bytes of a map's own name).
type layoutKey [64]byte

func layoutKeyOf(name string) layoutKey {
	var k layoutKey
	copy(k[:], name)
	return k
}

// layoutsSpec is the layouts map: map name → shape fingerprint.
func layoutsSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{Name: layoutsMapName, Type: ebpf.Hash, KeySize: 64, ValueSize: 8, MaxEntries: 256, Pinning: ebpf.PinByName}
}

// readLayouts reads the recorded fingerprints (none when no version wrote
// them yet).
func readLayouts(pinDir string) (map[string]uint64, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, layoutsMapName), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pinned map %s: %w", layoutsMapName, err)
	}
	defer m.Close()
	byKey, err := readMap[layoutKey, uint64](m)
	if err != nil {
		return nil, fmt.Errorf("pinned map %s: %w", layoutsMapName, err)
	}
	out := make(map[string]uint64, len(byKey))
	for k, v := range byKey {
		out[strings.TrimRight(string(k[:]), "\x00")] = v
	}
	return out, nil
}

// recordLayouts records the fingerprint of every map specs pin, once the
// programs loaded with them, and forgets maps this version has not.
func recordLayouts(pinDir string, specs []*ebpf.CollectionSpec) error {
	m, err := ebpf.NewMapWithOptions(layoutsSpec(), ebpf.MapOptions{PinPath: pinDir})
	if err != nil {
		return fmt.Errorf("map %s: %w", layoutsMapName, err)
	}
	defer m.Close()
	recorded, err := readMap[layoutKey, uint64](m)
	if err != nil {
		return fmt.Errorf("map %s: %w", layoutsMapName, err)
	}
	specsByName := pinnedSpecs(specs)
	for k := range recorded {
		if _, ok := specsByName[strings.TrimRight(string(k[:]), "\x00")]; ok {
			continue
		}
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("map %s: %w", layoutsMapName, err)
		}
	}
	for name, spec := range specsByName {
		if err := m.Put(layoutKeyOf(name), layoutOf(spec)); err != nil {
			return fmt.Errorf("record the layout of %s: %w", name, err)
		}
	}
	return nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/weirnet/weir/internal/datapath/bpffs"
	"github.com/weirnet/weir/internal/testutil"
)

// migrationPinDir is an empty pin directory and the programs' config over
// it; nothing is loaded yet.
func migrationPinDir(t *testing.T) (string, ProgramConfig) {
	t.Helper()
	testutil.RequireRoot(t)
	dir := testutil.BPFDir(t)
	if _, err := bpffs.Ensure(dir); err != nil {
		t.Fatal(err)
	}
	return dir, ProgramConfig{Mode: ModeVXLAN, OverlayIfindex: 99, PodCIDR: netip.MustParsePrefix("10.244.1.0/24"),
		ClusterCIDR: netip.MustParsePrefix("10.244.0.0/16"), PinDir: dir}
}

// pinEarlier pins, as an earlier version would have, the map this
// version calls name with its definition changed by change; it returns
// an open handle, as the earlier version's programs hold one.
func pinEarlier(t *testing.T, dir, name string, change func(*ebpf.MapSpec)) *ebpf.Map {
	t.Helper()
	specs, err := entrySpecs()
	if err != nil {
		t.Fatal(err)
	}
	spec, ok := pinnedSpecs(specs.all())[name]
	if !ok {
		t.Fatalf("no pinned map %s", name)
	}
	s := spec.Copy()
	change(s)
	m, err := ebpf.NewMapWithOptions(s, ebpf.MapOptions{PinPath: dir})
	if err != nil {
		t.Fatalf("pin earlier %s: %v", name, err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// entry is a distinct key and value of m's sizes.
func entry(m *ebpf.Map, i byte) ([]byte, []byte) {
	k, v := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
	k[len(k)-1], k[0] = i, 0xaa
	v[0] = i + 1
	return k, v
}

func mustPut(t *testing.T, m *ebpf.Map, k, v []byte) {
	t.Helper()
	if err := m.Put(k, v); err != nil {
		t.Fatal(err)
	}
}

func holds(m *ebpf.Map, k []byte) bool {
	v := make([]byte, m.ValueSize())
	return m.Lookup(k, v) == nil
}

// An earlier version's maps of another size are carried over with their
// entries; what its programs wrote into a program-written map until the
// links moved is copied again at the finish, an agent-written map's entry
// the agent removed meanwhile is not brought back; counters start anew.
func TestMigrateResizedMaps(t *testing.T) {
	dir, cfg := migrationPinDir(t)
	oldCT := pinEarlier(t, dir, "weir_ct", func(s *ebpf.MapSpec) { s.MaxEntries /= 2 })
	oldIPCache := pinEarlier(t, dir, "weir_ipcache", func(s *ebpf.MapSpec) { s.MaxEntries *= 2 })
	pinEarlier(t, dir, "weir_events", func(s *ebpf.MapSpec) { s.MaxEntries *= 2 })
	ct1, ct1v := entry(oldCT, 1)
	ip1, ip1v := entry(oldIPCache, 1)
	ip2, ip2v := entry(oldIPCache, 2)
	mustPut(t, oldCT, ct1, ct1v)
	mustPut(t, oldIPCache, ip1, ip1v)
	mustPut(t, oldIPCache, ip2, ip2v)
	if err := CheckPins(dir); err != nil {
		t.Fatalf("check before the upgrade: %v", err)
	}
	if got, _ := ebpf.LoadPinnedMap(filepath.Join(dir, "weir_ct"), nil); got == nil || got.MaxEntries() != oldCT.MaxEntries() {
		t.Fatal("the check changed a pin")
	} else {
		got.Close()
	}

	p, err := LoadPrograms(cfg)
	if err != nil {
		t.Fatalf("load over an earlier version's pins: %v", err)
	}
	defer p.Close()
	specs, _ := entrySpecs()
	want := pinnedSpecs(specs.all())
	for name, m := range map[string]*ebpf.Map{"weir_ct": p.CT, "weir_ipcache": p.IPCache, "weir_events": p.Events} {
		if m.MaxEntries() != want[name].MaxEntries {
			t.Errorf("%s holds %d entries at most, want this version's %d", name, m.MaxEntries(), want[name].MaxEntries)
		}
	}
	if !holds(p.CT, ct1) || !holds(p.IPCache, ip1) || !holds(p.IPCache, ip2) {
		t.Fatal("entries were not carried over")
	}
	notes := strings.Join(p.MigrationNotes(), "\n")
	for _, name := range []string{"weir_ct", "weir_ipcache", "weir_events"} {
		if !strings.Contains(notes, name) {
			t.Errorf("notes do not name %s: %s", name, notes)
		}
	}

	// The earlier programs go on writing until their links move; the
	// agent removes an address meanwhile.
	ct2, ct2v := entry(oldCT, 2)
	mustPut(t, oldCT, ct2, ct2v)
	if err := p.IPCache.Delete(ip2); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "weir_ct"+oldPinSuffix)); err != nil {
		t.Errorf("the old conntrack map is not kept until the finish: %v", err)
	}
	n, err := p.FinishMigration()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"weir_ct", "weir_ipcache", "weir_events"} {
		if _, err := os.Stat(filepath.Join(dir, name+oldPinSuffix)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s's old pin outlived the finish: %v", name, err)
		}
	}
	if n != 1 || !holds(p.CT, ct2) {
		t.Errorf("finish copied %d entries (conntrack entry written meanwhile held: %v), want that one", n, holds(p.CT, ct2))
	}
	if holds(p.IPCache, ip2) {
		t.Error("finish brought back an address the agent removed")
	}

	// The next start finds this version's maps and changes nothing.
	again, err := LoadPrograms(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if notes := again.MigrationNotes(); len(notes) > 0 {
		t.Errorf("a restart of the same version migrated %v", notes)
	}
}

// A map whose key or value changed size cannot be carried over: the load
// is refused naming it, and no pin is touched, not even those it could
// have carried over.
func TestMigrateRefusesChangedSizes(t *testing.T) {
	dir, cfg := migrationPinDir(t)
	oldIPCache := pinEarlier(t, dir, "weir_ipcache", func(s *ebpf.MapSpec) { s.MaxEntries *= 2 })
	oldCT := pinEarlier(t, dir, "weir_ct", func(s *ebpf.MapSpec) { s.ValueSize += 8; s.Value = nil })
	k, v := entry(oldCT, 1)
	mustPut(t, oldCT, k, v)

	if err := CheckPins(dir); !errors.Is(err, ErrMapLayout) {
		t.Fatalf("check before the upgrade: %v, want %v", err, ErrMapLayout)
	}
	p, err := LoadPrograms(cfg)
	if err == nil {
		p.Close()
		t.Fatal("loaded over a conntrack map of another value size")
	}
	if !errors.Is(err, ErrMapLayout) || !strings.Contains(err.Error(), "weir_ct (ValueSize") || !strings.Contains(err.Error(), "weir-agent uninstall") {
		t.Fatalf("error does not name the map, the change and the way out: %v", err)
	}
	for name, old := range map[string]*ebpf.Map{"weir_ct": oldCT, "weir_ipcache": oldIPCache} {
		pinned, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		a, _ := pinned.Info()
		b, _ := old.Info()
		aID, _ := a.ID()
		bID, _ := b.ID()
		pinned.Close()
		if aID != bID {
			t.Errorf("%s's pin was replaced by a refused load", name)
		}
	}
	if !holds(oldCT, k) {
		t.Error("the refused load emptied the conntrack map")
	}
	if got := pinNames(t, dir); got != "weir_ct weir_ipcache" {
		t.Errorf("a refused load left pins %q, want the two it found alone", got)
	}
}

func pinNames(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return strings.Join(names, " ")
}

// An agent stopped after swapping the maps in, before the finish, leaves
// the old ones pinned aside: the next start copies what they gained and
// removes them.
func TestMigrateFinishesAfterARestart(t *testing.T) {
	dir, cfg := migrationPinDir(t)
	oldCT := pinEarlier(t, dir, "weir_ct", func(s *ebpf.MapSpec) { s.MaxEntries /= 2 })
	p, err := LoadPrograms(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.Close() // stopped before FinishMigration
	k, v := entry(oldCT, 3)
	mustPut(t, oldCT, k, v)

	again, err := LoadPrograms(cfg)
	if err != nil {
		t.Fatalf("start after an unfinished migration: %v", err)
	}
	defer again.Close()
	if n, err := again.FinishMigration(); err != nil || n != 1 || !holds(again.CT, k) {
		t.Fatalf("finish after a restart: %d entries, %v; the old map's entry held: %v", n, err, holds(again.CT, k))
	}
	if _, err := os.Stat(filepath.Join(dir, "weir_ct"+oldPinSuffix)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old pin outlived the finish: %v", err)
	}
}

// A hash map shrunk below what it holds cannot be carried over: the check
// and the load refuse it, saying how many entries it holds.
func TestMigrateRefusesWhatDoesNotFit(t *testing.T) {
	dir, cfg := migrationPinDir(t)
	specs, err := entrySpecs()
	if err != nil {
		t.Fatal(err)
	}
	limit := pinnedSpecs(specs.all())["weir_peer_nodes"].MaxEntries
	old := pinEarlier(t, dir, "weir_peer_nodes", func(s *ebpf.MapSpec) { s.MaxEntries = limit + 10 })
	key, value := make([]byte, old.KeySize()), make([]byte, old.ValueSize())
	for i := range limit + 1 {
		binary.LittleEndian.PutUint32(key[4:], i)
		mustPut(t, old, key, value)
	}
	want := fmt.Sprintf("weir_peer_nodes (it holds %d entries, this version's at most %d)", limit+1, limit)
	if err := CheckPins(dir); !errors.Is(err, ErrMapLayout) || !strings.Contains(err.Error(), want) {
		t.Fatalf("check: %v, want %q", err, want)
	}
	if p, err := LoadPrograms(cfg); err == nil {
		p.Close()
		t.Fatal("loaded over a map that does not fit")
	}
}

// The same sizes laid out differently are refused too, told by the shape
// recorded at the previous load.
func TestMigrateRefusesChangedShape(t *testing.T) {
	_, cfg := migrationPinDir(t)
	p, err := LoadPrograms(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	layouts, err := ebpf.LoadPinnedMap(filepath.Join(cfg.PinDir, layoutsMapName), nil)
	if err != nil {
		t.Fatalf("no layouts recorded: %v", err)
	}
	defer layouts.Close()
	if err := layouts.Put(layoutKeyOf("weir_lb4_backends"), uint64(1)); err != nil {
		t.Fatal(err)
	}
	p, err = LoadPrograms(cfg)
	if err == nil {
		p.Close()
		t.Fatal("loaded over a map recorded with another shape")
	}
	if !errors.Is(err, ErrMapLayout) || !strings.Contains(err.Error(), "weir_lb4_backends (its key or value is laid out differently") {
		t.Fatalf("error does not name the map and the change: %v", err)
	}
}

// A value that gained members at its end (policy_entry's http) is carried
// over with its entries, the new members zero, when the earlier layout
// recorded (or, by a version that recorded none, the earlier map's own
// BTF) is this one's cut at the old size; any other earlier layout of
// that size is refused.
func TestMigrateWidenedValues(t *testing.T) {
	specs, err := entrySpecs()
	if err != nil {
		t.Fatal(err)
	}
	cur := pinnedSpecs(specs.all())["weir_policy"]
	const oldSize = 52 // policy_entry before http
	earlier, ok := valuePrefix(cur, oldSize)
	if !ok || cur.ValueSize != oldSize+4 {
		t.Fatalf("weir_policy's value is %d bytes: this test knows the 4 bytes http added to 52", cur.ValueSize)
	}
	// Another value of that size under the same name: one byte array.
	other := &btf.Struct{Name: "policy_entry", Size: oldSize, Members: []btf.Member{
		{Name: "raw", Type: &btf.Array{Index: &btf.Int{Size: 4}, Type: &btf.Int{Name: "unsigned char", Size: 1}, Nelems: oldSize}}}}
	for _, c := range []struct {
		name   string
		value  btf.Type // the earlier map's value type, in its BTF
		layout uint64   // recorded for it; 0: none (a version before records)
		carry  bool
	}{
		{"prefix recorded", earlier.Value, layoutOf(earlier), true},
		{"other layout recorded", earlier.Value, layoutOf(earlier) + 1, false},
		{"nothing recorded, its BTF a prefix", earlier.Value, 0, true},
		{"nothing recorded, its BTF another layout", other, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, cfg := migrationPinDir(t)
			old := pinEarlier(t, dir, "weir_policy", func(s *ebpf.MapSpec) { s.Value, s.ValueSize = c.value, oldSize })
			if c.layout != 0 {
				layouts, err := ebpf.NewMapWithOptions(layoutsSpec(), ebpf.MapOptions{PinPath: dir})
				if err != nil {
					t.Fatal(err)
				}
				defer layouts.Close()
				if err := layouts.Put(layoutKeyOf("weir_policy"), c.layout); err != nil {
					t.Fatal(err)
				}
			}
			k := lxcPolicyKey{Prefixlen: 128, Ifindex: 12, Identity: 300, Proto: 6, Dport: 80}
			v := make([]byte, oldSize)
			for i := range v {
				v[i] = byte(i + 1)
			}
			if err := old.Put(k, v); err != nil {
				t.Fatal(err)
			}
			p, err := LoadPrograms(cfg)
			if !c.carry {
				if err == nil {
					p.Close()
					t.Fatal("loaded over a shorter value of another layout")
				}
				if !errors.Is(err, ErrMapLayout) || !strings.Contains(err.Error(), "weir_policy (ValueSize") {
					t.Fatalf("error does not name the map and the change: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			got := make([]byte, cur.ValueSize)
			if err := p.Policy.Lookup(k, got); err != nil {
				t.Fatalf("the entry was not carried over: %v", err)
			}
			want := append(v, 0, 0, 0, 0)
			if string(got) != string(want) {
				t.Fatalf("carried value %x, want %x", got, want)
			}
			if notes := strings.Join(p.MigrationNotes(), "; "); !strings.Contains(notes, "weir_policy carried over (1 entries, values widened from 52 to 56 bytes") {
				t.Fatalf("notes %q do not say the values were widened", notes)
			}
			if _, err := p.FinishMigration(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

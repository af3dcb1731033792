package datapath

import (
	"maps"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/weirnet/weir/internal/service"
)

// emptyTwin is a new, empty map shaped like m.
func emptyTwin(t *testing.T, m *ebpf.Map) *ebpf.Map {
	t.Helper()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	d, err := ebpf.NewMap(&ebpf.MapSpec{Type: info.Type, KeySize: info.KeySize, ValueSize: info.ValueSize,
		MaxEntries: info.MaxEntries, Flags: info.Flags})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// serviceMaps reads the service and backend maps whole.
func serviceMaps(t *testing.T, p *Programs) (map[sockLb4Key]sockLb4Service, map[sockLb4BackendKey]sockLb4Backend) {
	t.Helper()
	svcs, err := readMap[sockLb4Key, sockLb4Service](p.LB4Services)
	if err != nil {
		t.Fatal(err)
	}
	slots, err := readMap[sockLb4BackendKey, sockLb4Backend](p.LB4Backends)
	if err != nil {
		t.Fatal(err)
	}
	return svcs, slots
}

// manyServices is a table of count frontends with two backends each.
func manyServices(count int) service.Table {
	t := service.Table{}
	for i := range count {
		f := service.Frontend{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Proto: service.ProtoTCP}
		t[f] = service.Entry{Backends: []service.Backend{{Addr: podA, Port: 8080}, {Addr: podB, Port: 8080}}}
	}
	return t
}

// TestSetServicesWritesOnlyWhatChanged: with 2,000 frontends in the maps,
// a change to one Service writes that Service's entries and nothing else
// (the maps are swapped for empty twins to see every write), and after a
// failed write the maps are read again, so nothing is left out.
func TestSetServicesWritesOnlyWhatChanged(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	n := &Node{progs: p}
	before := manyServices(2000)
	if err := n.SetServices(before); err != nil {
		t.Fatal(err)
	}
	after := manyServices(2000)
	changed := service.Frontend{Addr: netip.MustParseAddr("10.96.3.7"), Port: 80, Proto: service.ProtoTCP}
	after[changed] = service.Entry{Backends: []service.Backend{{Addr: podA, Port: 8080}, {Addr: podB, Port: 8080}, {Addr: podB, Port: 9090}}}

	realServices, realBackends := p.LB4Services, p.LB4Backends
	p.LB4Services, p.LB4Backends = emptyTwin(t, realServices), emptyTwin(t, realBackends)
	if err := n.SetServices(after); err != nil {
		t.Fatal(err)
	}
	svcs, slots := serviceMaps(t, p)
	wantSvcs := map[sockLb4Key]sockLb4Service{lb4Key(changed): {Count: 3}}
	wantSlots := map[sockLb4BackendKey]sockLb4Backend{{Svc: lb4Key(changed), Slot: 3}: lb4Backend(service.Backend{Addr: podB, Port: 9090})}
	if !reflect.DeepEqual(svcs, wantSvcs) || !reflect.DeepEqual(slots, wantSlots) {
		t.Errorf("one Service changed: wrote services %v and slots %v, want %v and %v", svcs, slots, wantSvcs, wantSlots)
	}

	// The real maps missed that write: a failed write makes the next one
	// read the maps instead of trusting what it remembers.
	p.LB4Services, p.LB4Backends = realServices, fullDecoy(t, realBackends, sockLb4BackendKey{Slot: 99}, sockLb4Backend{})
	broken := manyServices(2000)
	broken[service.Frontend{Addr: netip.MustParseAddr("10.97.0.1"), Port: 80, Proto: service.ProtoTCP}] = service.Entry{Backends: []service.Backend{{Addr: podA, Port: 1}}}
	if err := n.SetServices(broken); err == nil {
		t.Fatal("SetServices with a full backend map succeeded")
	}
	p.LB4Backends = realBackends
	if err := n.SetServices(after); err != nil {
		t.Fatal(err)
	}
	got, err := n.Services()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(after) || !got[changed].Equal(after[changed]) {
		t.Errorf("after a failed write the maps hold %d frontends, %v for the changed one; want %d and %v",
			len(got), got[changed], len(after), after[changed])
	}
	for f, e := range after {
		if !got[f].Equal(e) {
			t.Fatalf("frontend %v: maps hold %v, want %v", f, got[f], e)
		}
	}
}

// TestUpdateServicesWritesOnlyTheChangedFrontends: with 2,000 frontends
// in the maps, updating one and deleting another writes those two alone
// (the maps are swapped for empty twins to see every write) and leaves
// every other frontend as it was; a frontend with affinity and one from
// outside get their members and Maglev table, and lose them when deleted.
func TestUpdateServicesWritesOnlyTheChangedFrontends(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	n := &Node{progs: p}
	table := manyServices(2000)
	if err := n.SetServices(table); err != nil {
		t.Fatal(err)
	}
	grown := service.Frontend{Addr: netip.MustParseAddr("10.96.3.7"), Port: 80, Proto: service.ProtoTCP}
	gone := service.Frontend{Addr: netip.MustParseAddr("10.96.3.8"), Port: 80, Proto: service.ProtoTCP}
	grownEntry := service.Entry{Backends: []service.Backend{{Addr: podA, Port: 8080}, {Addr: podB, Port: 8080}, {Addr: podB, Port: 9090}}}

	realServices, realBackends := p.LB4Services, p.LB4Backends
	p.LB4Services, p.LB4Backends = emptyTwin(t, realServices), emptyTwin(t, realBackends)
	if err := n.UpdateServices(map[service.Frontend]*service.Entry{grown: &grownEntry, gone: nil}); err != nil {
		t.Fatal(err)
	}
	svcs, slots := serviceMaps(t, p)
	wantSvcs := map[sockLb4Key]sockLb4Service{lb4Key(grown): {Count: 3}}
	wantSlots := map[sockLb4BackendKey]sockLb4Backend{{Svc: lb4Key(grown), Slot: 3}: lb4Backend(service.Backend{Addr: podB, Port: 9090})}
	if !reflect.DeepEqual(svcs, wantSvcs) || !reflect.DeepEqual(slots, wantSlots) {
		t.Errorf("one frontend grown, one deleted: wrote services %v and slots %v, want %v and %v", svcs, slots, wantSvcs, wantSlots)
	}

	// On the real maps: the deletion takes the frontend's slots along,
	// and the rest is untouched.
	p.LB4Services, p.LB4Backends = realServices, realBackends
	n.lbWritten = nil
	if err := n.UpdateServices(map[service.Frontend]*service.Entry{grown: &grownEntry, gone: nil}); err != nil {
		t.Fatal(err)
	}
	table[grown] = grownEntry
	delete(table, gone)
	affinity := service.Frontend{Addr: netip.MustParseAddr("10.97.0.1"), Port: 80, Proto: service.ProtoTCP}
	outside := service.Frontend{Addr: netip.MustParseAddr("10.99.0.11"), Port: 30080, Proto: service.ProtoTCP, External: true}
	table[affinity] = service.Entry{Backends: []service.Backend{{Addr: podA, Port: 8080}}, AffinityTimeout: time.Minute}
	table[outside] = service.Entry{Backends: []service.Backend{{Addr: podB, Port: 8080}}}
	if err := n.UpdateServices(map[service.Frontend]*service.Entry{affinity: ptr(table[affinity]), outside: ptr(table[outside])}); err != nil {
		t.Fatal(err)
	}
	got, err := n.Services()
	if err != nil {
		t.Fatal(err)
	}
	if !maps.EqualFunc(got, table, service.Entry.Equal) {
		t.Fatalf("maps hold %d frontends, want %d", len(got), len(table))
	}
	if m, err := readMap[sockLb4MemberKey, uint32](p.LB4Members); err != nil || len(m) != 1 {
		t.Errorf("affinity members %v (%v), want one", m, err)
	}
	var mg hostLb4Maglev
	if err := p.LB4Maglev.Lookup(lb4Key(outside), &mg); err != nil {
		t.Errorf("no Maglev table for the frontend from outside: %v", err)
	}
	if err := n.UpdateServices(map[service.Frontend]*service.Entry{affinity: nil, outside: nil}); err != nil {
		t.Fatal(err)
	}
	if m, err := readMap[sockLb4MemberKey, uint32](p.LB4Members); err != nil || len(m) != 0 {
		t.Errorf("affinity members after the delete: %v (%v)", m, err)
	}
	if err := p.LB4Maglev.Lookup(lb4Key(outside), &mg); err == nil {
		t.Error("Maglev table kept after the delete")
	}
	if s, err := readMap[sockLb4BackendKey, sockLb4Backend](p.LB4Backends); err != nil || len(s) != 2*1999+1 {
		t.Errorf("%d backend slots (%v), want %d", len(s), err, 2*1999+1)
	}
}

func ptr[T any](v T) *T { return &v }

package datapath

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/weirnet/weir/internal/service"
	"github.com/weirnet/weir/internal/testutil"
)

// TestCountEntries counts an LRU hash (as conntrack) and an LPM trie (as
// the policy map) in batches and key by key, whole and up to a limit.
func TestCountEntries(t *testing.T) {
	testutil.RequireRoot(t)
	for _, c := range []struct {
		name string
		spec *ebpf.MapSpec
		put  func(m *ebpf.Map, i uint32) error
	}{
		{"lru hash", &ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: 4, ValueSize: 8, MaxEntries: 20000},
			func(m *ebpf.Map, i uint32) error { return m.Put(i, uint64(i)) }},
		{"lpm trie", &ebpf.MapSpec{Type: ebpf.LPMTrie, KeySize: 8, ValueSize: 4, MaxEntries: 20000, Flags: 1}, // BPF_F_NO_PREALLOC
			func(m *ebpf.Map, i uint32) error { return m.Put([2]uint32{32, i}, i) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := ebpf.NewMap(c.spec)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			const n = 9000 // more than two batches
			for i := range uint32(n) {
				if err := c.put(m, i); err != nil {
					t.Fatal(err)
				}
			}
			var got [4]int
			var errs [4]error
			if c.spec.Type == ebpf.LRUHash {
				got[0], errs[0] = countEntries[uint32, uint64](m, 0)
				got[1], errs[1] = countEntries[uint32, uint64](m, 10)
				// Every kernel Weir supports batches hash maps.
				if _, err := countInBatches[uint32, uint64](m, 0); err != nil {
					t.Errorf("batch count of an LRU hash: %v", err)
				}
			} else {
				got[0], errs[0] = countEntries[[2]uint32, uint32](m, 0)
				got[1], errs[1] = countEntries[[2]uint32, uint32](m, 10)
				_, err := countInBatches[[2]uint32, uint32](m, 0)
				t.Logf("batch count of an LPM trie: %v (nil: batched)", err)
			}
			got[2], errs[2] = countKeys(m, 0)
			got[3], errs[3] = countKeys(m, 10)
			for i, want := range []int{n, countBatch, n, 10} {
				if errs[i] != nil || (i != 1 && got[i] != want) || (i == 1 && (got[i] < 10 || got[i] > want)) {
					t.Errorf("count %d: %d (%v), want %d", i, got[i], errs[i], want)
				}
			}
		})
	}
}

// TestEveryFillMapIsCounted: each map the agent reports fill for can be
// counted on the loaded programs, its capacity is the map's, and what is
// written to it shows in the count.
func TestEveryFillMapIsCounted(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	n := &Node{progs: p}
	if err := n.SetServices(service.Table{
		{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: service.ProtoUDP}: {Backends: []service.Backend{
			{Addr: podA, Port: 53}, {Addr: podB, Port: 53}}},
		{Addr: netip.MustParseAddr("10.96.0.11"), Port: 80, Proto: service.ProtoTCP}: {Backends: []service.Backend{
			{Addr: podA, Port: 80}}, AffinityTimeout: time.Minute},
	}); err != nil {
		t.Fatal(err)
	}
	for _, name := range FillMaps {
		m, err := n.fillMap(name)
		if err != nil {
			t.Fatal(err)
		}
		capacity, err := n.MapCapacity(name)
		if err != nil || capacity != int(m.MaxEntries()) || capacity == 0 {
			t.Errorf("%s: capacity %d (%v), want %d", name, capacity, err, m.MaxEntries())
		}
		entries, err := n.MapEntries(name, 0)
		if err != nil {
			t.Errorf("%s: count: %v", name, err)
		}
		want := map[string]int{MapServices: 2, MapBackends: 3, MapMembers: 1, MapEndpoints: 2, MapTunnels: 1}[name]
		if want > 0 && entries < want {
			t.Errorf("%s: %d entries, want at least %d", name, entries, want)
		}
	}
	if _, err := n.MapEntries("nope", 0); !errors.Is(err, ErrUnknownMap) {
		t.Errorf("unknown map: %v, want ErrUnknownMap", err)
	}
}

// TestFullServiceMapLeavesNoHalfService: when a Service's backend slots
// cannot all be written, SetServices says which map is full and the
// frontend is not translated at all (its count is written last), rather
// than sent to some of its backends; the Services already there stay.
func TestFullServiceMapLeavesNoHalfService(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	n := &Node{progs: p}
	dns := service.Frontend{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: service.ProtoUDP}
	web := service.Frontend{Addr: netip.MustParseAddr("10.96.0.20"), Port: 80, Proto: service.ProtoTCP}
	dnsEntry := service.Entry{Backends: []service.Backend{{Addr: podA, Port: 53}}}
	if err := n.SetServices(service.Table{dns: dnsEntry}); err != nil {
		t.Fatal(err)
	}
	realBackends := p.LB4Backends
	p.LB4Backends = fullDecoy(t, realBackends, sockLb4BackendKey{Slot: 99}, sockLb4Backend{})
	err := n.SetServices(service.Table{dns: dnsEntry, web: {Backends: []service.Backend{{Addr: podA, Port: 8080}, {Addr: podB, Port: 8080}}}})
	p.LB4Backends = realBackends
	if !errors.Is(err, ErrServiceMapFull) {
		t.Fatalf("SetServices with a full backend map: %v, want ErrServiceMapFull", err)
	}
	if fes := FrontendErrors(err); len(fes) != 1 || fes[0].Frontend != web || !errors.Is(fes[0], ErrServiceMapFull) {
		t.Errorf("FrontendErrors(%v) = %v, want the one frontend that failed, with ErrServiceMapFull", err, fes)
	}
	got, err := n.Services()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got[web]; ok {
		t.Errorf("the frontend whose slots failed is translated: %v", got[web])
	}
	if len(got[dns].Backends) != 1 {
		t.Errorf("the Service already programmed: %v, want its one backend", got[dns])
	}
}

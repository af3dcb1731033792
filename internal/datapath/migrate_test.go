package datapath

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// A map's shape fingerprint changes with what its entries mean to the
// programs (offsets, sizes, kinds), not with the names of fields.
func TestLayoutOfShape(t *testing.T) {
	u32 := &btf.Int{Name: "u32", Size: 4}
	u16 := &btf.Int{Name: "u16", Size: 2}
	value := func(names [2]string, second btf.Type, offset btf.Bits) *ebpf.MapSpec {
		return &ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 8, Key: u32,
			Value: &btf.Struct{Name: "v", Size: 8, Members: []btf.Member{
				{Name: names[0], Type: u32, Offset: 0},
				{Name: names[1], Type: second, Offset: offset},
			}}}
	}
	base := layoutOf(value([2]string{"rev", "flags"}, u32, 32))
	if got := layoutOf(value([2]string{"revision", "bits"}, &btf.Typedef{Name: "flags_t", Type: u32}, 32)); got != base {
		t.Error("renaming fields or naming a type changed the fingerprint")
	}
	for what, spec := range map[string]*ebpf.MapSpec{
		"a member moved":          value([2]string{"rev", "flags"}, u32, 48),
		"a member's type changed": value([2]string{"rev", "flags"}, u16, 32),
		"the map's type changed":  func() *ebpf.MapSpec { s := value([2]string{"rev", "flags"}, u32, 32); s.Type = ebpf.LRUHash; return s }(),
	} {
		if layoutOf(spec) == base {
			t.Errorf("%s: same fingerprint", what)
		}
	}
}

package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

func owner(i int) Owner { return Owner{ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"} }

func TestAllocateSkipsReservedAndExhausts(t *testing.T) {
	a, err := Open(filepath.Join(t.TempDir(), "ipam.json"), netip.MustParsePrefix("10.0.0.0/29"))
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Capacity(); got != 5 { // .2 .. .6
		t.Fatalf("capacity = %d, want 5", got)
	}
	seen := map[netip.Addr]bool{}
	for i := 0; i < 5; i++ {
		l, err := a.Allocate(Lease{Owner: owner(i)})
		if err != nil {
			t.Fatalf("allocate %d: %v", i, err)
		}
		if !a.usable(l.Addr) || seen[l.Addr] {
			t.Fatalf("allocate %d gave %v (reserved or duplicate)", i, l.Addr)
		}
		seen[l.Addr] = true
	}
	if _, err := a.Allocate(Lease{Owner: owner(9)}); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("sixth allocation: err = %v, want ErrPoolExhausted", err)
	}
}

func TestAllocateIsNextFit(t *testing.T) {
	a, _ := Open(filepath.Join(t.TempDir(), "ipam.json"), netip.MustParsePrefix("10.0.0.0/24"))
	first, _ := a.Allocate(Lease{Owner: owner(1)})
	if _, _, err := a.Release(owner(1)); err != nil {
		t.Fatal(err)
	}
	second, _ := a.Allocate(Lease{Owner: owner(2)})
	if second.Addr == first.Addr {
		t.Fatalf("released address %v was reused at once", first.Addr)
	}
	if first.Addr != netip.MustParseAddr("10.0.0.2") {
		t.Fatalf("first address = %v, want 10.0.0.2", first.Addr)
	}
}

func TestDuplicateOwnerRejected(t *testing.T) {
	a, _ := Open(filepath.Join(t.TempDir(), "ipam.json"), netip.MustParsePrefix("10.0.0.0/24"))
	l, _ := a.Allocate(Lease{Owner: owner(1)})
	old, err := a.Allocate(Lease{Owner: owner(1)})
	if !errors.Is(err, ErrLeaseExists) || old.Addr != l.Addr {
		t.Fatalf("duplicate allocate: %v, %v", old, err)
	}
	if n := len(a.List()); n != 1 {
		t.Fatalf("%d leases after duplicate, want 1", n)
	}
}

func TestLeasesSurviveReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ipam.json")
	cidr := netip.MustParsePrefix("10.1.0.0/24")
	a, _ := Open(path, cidr)
	var want []netip.Addr
	for i := 0; i < 10; i++ {
		l, err := a.Allocate(Lease{Owner: owner(i), NetNS: "/var/run/netns/x"})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, l.Addr)
	}
	a.Release(owner(3))
	b, err := Open(path, cidr)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.List()) != 9 {
		t.Fatalf("reopened with %d leases, want 9", len(b.List()))
	}
	if l, ok := b.Get(owner(5)); !ok || l.Addr != want[5] || l.NetNS != "/var/run/netns/x" {
		t.Fatalf("lease 5 after reopen = %+v, %v", l, ok)
	}
	// The cursor survives too: the next address continues after the last.
	l, _ := b.Allocate(Lease{Owner: owner(20)})
	if l.Addr != want[9].Next() {
		t.Fatalf("after reopen allocated %v, want %v", l.Addr, want[9].Next())
	}
}

func TestCorruptStateIsAnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ipam.json")
	os.WriteFile(path, []byte("{not json"), 0o600)
	if _, err := Open(path, netip.MustParsePrefix("10.0.0.0/24")); !errors.Is(err, ErrCorruptState) {
		t.Fatalf("err = %v, want ErrCorruptState", err)
	}
}

func TestTooSmallCIDR(t *testing.T) {
	if _, err := Open(filepath.Join(t.TempDir(), "x"), netip.MustParsePrefix("10.0.0.0/31")); err == nil {
		t.Fatal("a /31 was accepted as a pod CIDR")
	}
}

func TestFailedSaveKeepsMemoryConsistent(t *testing.T) {
	dir := t.TempDir()
	a, _ := Open(filepath.Join(dir, "ipam.json"), netip.MustParsePrefix("10.0.0.0/24"))
	os.Chmod(dir, 0o500)
	defer os.Chmod(dir, 0o700)
	if os.Geteuid() == 0 {
		// root ignores directory permissions; make the path unwritable instead.
		a.path = filepath.Join(dir, "missing", "\x00bad")
	}
	if _, err := a.Allocate(Lease{Owner: owner(1)}); err == nil {
		t.Fatal("allocate succeeded although the state could not be saved")
	}
	if len(a.List()) != 0 {
		t.Fatal("a lease that was never persisted is still held")
	}
}

func FuzzAllocateRelease(f *testing.F) {
	f.Add([]byte{0, 1, 2, 130, 131, 3})
	f.Fuzz(func(t *testing.T, ops []byte) {
		a, err := Open(filepath.Join(t.TempDir(), "ipam.json"), netip.MustParsePrefix("10.0.0.0/28"))
		if err != nil {
			t.Fatal(err)
		}
		held := map[Owner]netip.Addr{}
		for _, op := range ops {
			o := owner(int(op & 0x1f))
			if op&0x80 == 0 {
				l, err := a.Allocate(Lease{Owner: o})
				if err == nil {
					held[o] = l.Addr
				}
			} else if _, ok, _ := a.Release(o); ok {
				delete(held, o)
			}
		}
		addrs := map[netip.Addr]bool{}
		for _, l := range a.List() {
			if addrs[l.Addr] || held[l.Owner] != l.Addr || !a.usable(l.Addr) {
				t.Fatalf("inconsistent lease %+v", l)
			}
			addrs[l.Addr] = true
		}
		if len(addrs) != len(held) {
			t.Fatalf("%d leases, %d held", len(addrs), len(held))
		}
	})
}

package policy

// idAllocator hands out small numbers for keys and takes back the ones a
// compile no longer uses, so numbers stay stable and bounded.
type idAllocator[K comparable] struct {
	ids  map[K]uint32
	free []uint32
	next uint32
}

func newIDAllocator[K comparable](first uint32) idAllocator[K] {
	return idAllocator[K]{ids: map[K]uint32{}, next: first}
}

func (a *idAllocator[K]) get(k K) uint32 {
	if id, ok := a.ids[k]; ok {
		return id
	}
	var id uint32
	if n := len(a.free); n > 0 {
		id, a.free = a.free[n-1], a.free[:n-1]
	} else {
		id = a.next
		a.next++
	}
	a.ids[k] = id
	return id
}

// keepOnly releases every key not in used.
func (a *idAllocator[K]) keepOnly(used map[K]bool) {
	for k, id := range a.ids {
		if !used[k] {
			delete(a.ids, k)
			a.free = append(a.free, id)
		}
	}
}

// forget releases every key not in used without handing its number out
// again: for numbers that name things outside the compile (the datapath's
// per-rule counters), which must never pass to something else.
func (a *idAllocator[K]) forget(used map[K]bool) {
	for k := range a.ids {
		if !used[k] {
			delete(a.ids, k)
		}
	}
}

package policy

import (
	"net/netip"
	"slices"
	"sort"

	"github.com/weirnet/weir/internal/l7"
)

// Diff is the least change that turns one Result's datapath state into
// another's. The loader (datapath.Node.ApplyPolicy) orders its writes so
// that a change never opens more than either state allows: addresses that
// change identity are closed first, then each endpoint's keys are written
// (new ones longest first, stale ones shortest first, flags in between),
// then the addresses take their new identities, then stale entries go.
type Diff struct {
	IPCacheUpsert map[netip.Addr]Identity
	CIDRUpsert    map[netip.Prefix]Identity
	Endpoints     []EndpointDiff // sorted by Pod
	IPCacheDelete []netip.Addr
	CIDRDelete    []netip.Prefix
	// HTTPSets are the HTTP sets next's entries name that prev's did
	// not, with their rules (in their HTTPRuleRef order), to be written
	// before the entries; HTTPSetsGone those only prev named, sorted, to
	// go after. A number names one set for the Compiler's life, so a set
	// in both is unchanged. Sets with conditional cluster rules
	// (TieredSet) are not among them: their flows are judged in user
	// space, against the Result, never by the sets' rules in the kernel.
	HTTPSets     map[HTTPSetID][]l7.Rule
	HTTPSetsGone []HTTPSetID
}

// EndpointDiff is the change to one endpoint's policy.
type EndpointDiff struct {
	Pod string
	// Gone: the endpoint left the Result; delete all it had.
	Gone bool
	// Enforced and Tiered are the new flags; FlagsChanged says they
	// differ (or the endpoint is new).
	Enforced     [2]bool
	Tiered       [2]bool
	FlagsChanged bool
	Upsert       map[Key]Entry
	Delete       []Key
}

// Empty reports whether applying d would change nothing.
func (d *Diff) Empty() bool {
	return len(d.IPCacheUpsert) == 0 && len(d.CIDRUpsert) == 0 && len(d.Endpoints) == 0 &&
		len(d.IPCacheDelete) == 0 && len(d.CIDRDelete) == 0 && len(d.HTTPSets) == 0 && len(d.HTTPSetsGone) == 0
}

// DiffResults computes the change from prev (nil: nothing loaded) to next.
func DiffResults(prev, next *Result) Diff {
	if prev == nil {
		prev = &Result{}
	}
	var d Diff
	d.IPCacheUpsert, d.IPCacheDelete = diffMap(prev.IPCache, next.IPCache)
	d.CIDRUpsert, d.CIDRDelete = diffMap(prev.CIDRs, next.CIDRs)
	sort.Slice(d.IPCacheDelete, func(i, j int) bool { return d.IPCacheDelete[i].Less(d.IPCacheDelete[j]) })
	sort.Slice(d.CIDRDelete, func(i, j int) bool { return d.CIDRDelete[i].String() < d.CIDRDelete[j].String() })
	for pod, ep := range next.Endpoints {
		old := prev.Endpoints[pod]
		ed := EndpointDiff{Pod: pod, Enforced: ep.Enforced, Tiered: ep.Tiered}
		var oldEntries map[Key]Entry
		if old == nil {
			ed.FlagsChanged = true
		} else {
			ed.FlagsChanged = old.Enforced != ep.Enforced || old.Tiered != ep.Tiered
			oldEntries = old.Entries
		}
		ed.Upsert, ed.Delete = diffMap(oldEntries, ep.Entries)
		if ed.FlagsChanged || len(ed.Upsert) > 0 || len(ed.Delete) > 0 {
			d.Endpoints = append(d.Endpoints, ed)
		}
	}
	for pod, old := range prev.Endpoints {
		if _, ok := next.Endpoints[pod]; !ok {
			ed := EndpointDiff{Pod: pod, Gone: true, FlagsChanged: true}
			_, ed.Delete = diffMap(old.Entries, nil)
			d.Endpoints = append(d.Endpoints, ed)
		}
	}
	sort.Slice(d.Endpoints, func(i, j int) bool { return d.Endpoints[i].Pod < d.Endpoints[j].Pod })
	for id, refs := range next.HTTPSets {
		if _, ok := prev.HTTPSets[id]; ok || next.TieredSet(id) {
			continue
		}
		if d.HTTPSets == nil {
			d.HTTPSets = map[HTTPSetID][]l7.Rule{}
		}
		rules := make([]l7.Rule, len(refs))
		for i, ref := range refs {
			rules[i] = next.HTTPRules[ref]
		}
		d.HTTPSets[id] = rules
	}
	for id := range prev.HTTPSets {
		if _, ok := next.HTTPSets[id]; !ok {
			d.HTTPSetsGone = append(d.HTTPSetsGone, id)
		}
	}
	slices.Sort(d.HTTPSetsGone)
	return d
}

// diffMap returns the entries of next that prev lacks or holds with another
// value, and the keys of prev that next lacks.
func diffMap[K comparable, V comparable](prev, next map[K]V) (upsert map[K]V, del []K) {
	for k, v := range next {
		if old, ok := prev[k]; !ok || old != v {
			if upsert == nil {
				upsert = map[K]V{}
			}
			upsert[k] = v
		}
	}
	for k := range prev {
		if _, ok := next[k]; !ok {
			del = append(del, k)
		}
	}
	return upsert, del
}

package policy

import (
	"fmt"
	"net/netip"
	"testing"

	"sigs.k8s.io/yaml"
)

func dumpPolicies(s *Snapshot) string {
	b, err := yaml.Marshal(map[string]any{"networkPolicies": s.Policies, "clusterPolicies": s.ClusterPolicies})
	if err != nil {
		return err.Error()
	}
	return "\n" + string(b)
}

// applyDiff plays a diff onto a copy of the datapath-visible state of prev,
// the way a loader would.
func applyDiff(t *testing.T, prev *Result, d Diff) *Result {
	t.Helper()
	out := &Result{Endpoints: map[string]*EndpointPolicy{},
		IPCache: map[netip.Addr]Identity{}, CIDRs: map[netip.Prefix]Identity{}}
	if prev != nil {
		for k, v := range prev.IPCache {
			out.IPCache[k] = v
		}
		for k, v := range prev.CIDRs {
			out.CIDRs[k] = v
		}
		for k, ep := range prev.Endpoints {
			cp := &EndpointPolicy{Pod: k, Enforced: ep.Enforced, Tiered: ep.Tiered, Entries: map[Key]Entry{}}
			for key, e := range ep.Entries {
				cp.Entries[key] = e
			}
			out.Endpoints[k] = cp
		}
	}
	for k, v := range d.IPCacheUpsert {
		out.IPCache[k] = v
	}
	for k, v := range d.CIDRUpsert {
		out.CIDRs[k] = v
	}
	for _, ed := range d.Endpoints {
		ep := out.Endpoints[ed.Pod]
		if ep == nil {
			ep = &EndpointPolicy{Pod: ed.Pod, Entries: map[Key]Entry{}}
			out.Endpoints[ed.Pod] = ep
		}
		for k, v := range ed.Upsert {
			ep.Entries[k] = v
		}
		for _, k := range ed.Delete {
			if _, ok := ep.Entries[k]; !ok {
				t.Fatalf("diff deletes %s from %s, which does not hold it", k, ed.Pod)
			}
			delete(ep.Entries, k)
		}
		ep.Enforced, ep.Tiered = ed.Enforced, ed.Tiered
		if ed.Gone {
			delete(out.Endpoints, ed.Pod)
		}
	}
	for _, k := range d.IPCacheDelete {
		delete(out.IPCache, k)
	}
	for _, k := range d.CIDRDelete {
		delete(out.CIDRs, k)
	}
	return out
}

func sameState(got, want *Result) error {
	if len(got.IPCache) != len(want.IPCache) || len(got.CIDRs) != len(want.CIDRs) {
		return fmt.Errorf("ipcache %d/%d entries, cidrs %d/%d", len(got.IPCache), len(want.IPCache), len(got.CIDRs), len(want.CIDRs))
	}
	for k, v := range want.IPCache {
		if got.IPCache[k] != v {
			return fmt.Errorf("ipcache %s: %d, want %d", k, got.IPCache[k], v)
		}
	}
	for k, v := range want.CIDRs {
		if got.CIDRs[k] != v {
			return fmt.Errorf("cidr %s: %d, want %d", k, got.CIDRs[k], v)
		}
	}
	if len(got.Endpoints) != len(want.Endpoints) {
		return fmt.Errorf("%d endpoints, want %d", len(got.Endpoints), len(want.Endpoints))
	}
	for pod, w := range want.Endpoints {
		g := got.Endpoints[pod]
		if g == nil || g.Enforced != w.Enforced || g.Tiered != w.Tiered || len(g.Entries) != len(w.Entries) {
			return fmt.Errorf("endpoint %s differs: %+v, want %+v", pod, g, w)
		}
		for k, v := range w.Entries {
			if g.Entries[k] != v {
				return fmt.Errorf("endpoint %s key %s: %+v, want %+v", pod, k, g.Entries[k], v)
			}
		}
	}
	return nil
}

package policy

import (
	"fmt"
	"sort"
	"strings"
)

// keyCount is how many policy keys r's endpoints hold.
func (r *Result) keyCount() int {
	n := 0
	for _, ep := range r.Endpoints {
		n += len(ep.Entries)
	}
	return n
}

// namespacesWithPolicies are the namespaces that hold a NetworkPolicy:
// the ones whose keys refusing can take back.
func namespacesWithPolicies(s *Snapshot) map[string]bool {
	out := map[string]bool{}
	for _, p := range s.Policies {
		out[p.Namespace] = true
	}
	return out
}

// overKeyBudget picks the namespaces to refuse so r fits max keys. The
// keys of endpoints no NetworkPolicy can account for (cluster policies',
// refused namespaces') come first; then namespaces are admitted by their
// endpoints' keys, fewest first, ties by name, and every one that does
// not fit is refused: the namespace that would take the map from the
// others is the one refused, whatever its name.
func overKeyBudget(r *Result, max int, refused map[string]error, withPolicies map[string]bool) map[string]error {
	byNS := map[string]int{}
	used := 0
	for pod, ep := range r.Endpoints {
		ns, _, _ := strings.Cut(pod, "/")
		if withPolicies[ns] && refused[ns] == nil {
			byNS[ns] += len(ep.Entries)
		} else {
			used += len(ep.Entries)
		}
	}
	names := make([]string, 0, len(byNS))
	for ns := range byNS {
		names = append(names, ns)
	}
	sort.Slice(names, func(i, j int) bool {
		if byNS[names[i]] != byNS[names[j]] {
			return byNS[names[i]] < byNS[names[j]]
		}
		return names[i] < names[j]
	})
	out := map[string]error{}
	for _, ns := range names {
		if used+byNS[ns] <= max {
			used += byNS[ns]
			continue
		}
		out[ns] = fmt.Errorf("namespace %s's policies need %d policy entries on this node, %d of %d are left: %w",
			ns, byNS[ns], max-min(used, max), max, ErrPolicyTooLarge)
	}
	return out
}

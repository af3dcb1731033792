package policy

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// labelSet is one distinct identity label set and the pods that have it.
type labelSet struct {
	key       string
	namespace string
	podLabels labels.Set
	nsLabels  labels.Set
	id        Identity // 0 until allocated
	pods      []*Pod
}

// selectorCache evaluates each distinct peer selector once per compile,
// however many rules repeat it.
type selectorCache struct {
	sets  []*labelSet
	cache map[string][]*labelSet
}

func newSelectorCache(sets []*labelSet) *selectorCache {
	return &selectorCache{sets: sets, cache: map[string][]*labelSet{}}
}

// asSelector converts a selector, nil meaning every label set.
func asSelector(s *metav1.LabelSelector) (labels.Selector, error) {
	if s == nil {
		return labels.Everything(), nil
	}
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return nil, fmt.Errorf("label selector: %w", err)
	}
	return sel, nil
}

// selectPeers returns the label sets a peer's selectors pick. A nil
// namespaceSelector means the policy's own namespace; a nil podSelector
// every pod of the selected namespaces.
func (c *selectorCache) selectPeers(policyNS string, nsSel, podSel *metav1.LabelSelector) ([]*labelSet, error) {
	ns, err := asSelector(nsSel)
	if err != nil {
		return nil, err
	}
	pod, err := asSelector(podSel)
	if err != nil {
		return nil, err
	}
	scope := "*"
	if nsSel == nil {
		scope = "=" + policyNS
	}
	key := scope + "|" + ns.String() + "|" + pod.String()
	if got, ok := c.cache[key]; ok {
		return got, nil
	}
	var out []*labelSet
	for _, s := range c.sets {
		if nsSel == nil && s.namespace != policyNS {
			continue
		}
		if ns.Matches(s.nsLabels) && pod.Matches(s.podLabels) {
			out = append(out, s)
		}
	}
	c.cache[key] = out
	return out, nil
}

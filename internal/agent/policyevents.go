package agent

import (
	"errors"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/weirnet/weir/internal/policy"
)

// policyEvents tells the owners of NetworkPolicies that this node could
// not load as written, with a Warning event on the policy: NetworkPolicy
// has no status to carry it. Each node says it once per message, again
// only after the message changed or the policy loaded in between.
type policyEvents struct {
	rec  record.EventRecorder // nil outside Kubernetes
	node string
	sent map[string]string // namespace/name -> the message last sent
}

// Event reasons.
const (
	reasonPolicyTooLarge       = "PolicyTooLarge"
	reasonPolicyInvalid        = "PolicyNotLoaded"
	reasonMapNearlyFull        = "BPFMapNearlyFull"
	reasonIdentitiesNearlyFull = "IdentitySpaceNearlyFull"
)

// mapFullEvent returns what tells the cluster that one of this node's
// datapath maps passed the warning threshold: a Warning event on the
// Node, beside the log line and the weir_map_fill_ratio metric.
func mapFullEvent(rec record.EventRecorder, node string) func(name string, entries, capacity int) {
	ref := &corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)}
	return func(name string, entries, capacity int) {
		if name == fillIdentities {
			rec.Eventf(ref, corev1.EventTypeWarning, reasonIdentitiesNearlyFull,
				"%d of %d security identities are taken; a pod whose label set gets none is unidentified and denied wherever a policy applies", entries, capacity)
			return
		}
		rec.Eventf(ref, corev1.EventTypeWarning, reasonMapNearlyFull,
			"datapath map %s holds %d of %d entries; when full, new connections or policy entries fail (closed)", name, entries, capacity)
	}
}

// report sends an event for each NetworkPolicy error of a compilation.
func (pe *policyEvents) report(policies []*networkingv1.NetworkPolicy, errs []error) {
	if pe.rec == nil {
		return
	}
	byKey := make(map[string]*networkingv1.NetworkPolicy, len(policies))
	for _, p := range policies {
		byKey[p.Namespace+"/"+p.Name] = p
	}
	now := map[string]string{}
	for _, err := range errs {
		var npe *policy.NetworkPolicyError
		if !errors.As(err, &npe) {
			continue
		}
		key, msg := npe.Namespace+"/"+npe.Name, npe.Err.Error()
		now[key] = msg
		obj := byKey[key]
		if obj == nil || pe.sent[key] == msg {
			continue
		}
		reason := reasonPolicyInvalid
		if errors.Is(npe.Err, policy.ErrPolicyTooLarge) {
			reason = reasonPolicyTooLarge
		}
		pe.rec.Eventf(obj, corev1.EventTypeWarning, reason,
			"node %s cannot load this policy: %s; the pods it selects there fail closed", pe.node, msg)
	}
	pe.sent = now
}

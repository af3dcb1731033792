package agent

import (
	"errors"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/policy"
)

// policyEvents tells the owners of NetworkPolicies and WeirNetworkPolicies
// that this node could not load as written, with a Warning event on the
// policy: NetworkPolicy has no status to carry it, and the agents write
// none on WeirNetworkPolicies yet. Each node says it once per message,
// again only after the message changed or the policy loaded in between.
type policyEvents struct {
	rec  record.EventRecorder // nil outside Kubernetes
	node string
	sent map[string]string // kind/namespace/name -> the message last sent
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

// report sends an event for each NetworkPolicy or WeirNetworkPolicy
// error of a compilation, on the object of the kind the error names: the
// two kinds may share a name. http marks the WeirNetworkPolicies among
// policies (k8s.Snapshot.HTTP).
func (pe *policyEvents) report(policies []*networkingv1.NetworkPolicy, http map[*networkingv1.NetworkPolicy]*policy.PolicyHTTP, errs []error) {
	if pe.rec == nil {
		return
	}
	byKey := make(map[string]runtime.Object, len(policies))
	for _, p := range policies {
		kind, obj := policy.KindNetworkPolicy, runtime.Object(p)
		if _, ok := http[p]; ok {
			kind, obj = policy.KindWeirNetworkPolicy, weirPolicyRef(p)
		}
		byKey[kind+"/"+p.Namespace+"/"+p.Name] = obj
	}
	now := map[string]string{}
	for _, err := range errs {
		var npe *policy.NetworkPolicyError
		if !errors.As(err, &npe) {
			continue
		}
		kind := npe.Kind
		if kind == "" {
			kind = policy.KindNetworkPolicy
		}
		key, msg := kind+"/"+npe.Namespace+"/"+npe.Name, npe.Err.Error()
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

// weirPolicyRef refers to the WeirNetworkPolicy p was read from. p carries
// its metadata, but as a NetworkPolicy the event would name a
// NetworkPolicy of that name, which may not exist or be another object.
func weirPolicyRef(p *networkingv1.NetworkPolicy) *corev1.ObjectReference {
	return &corev1.ObjectReference{
		Kind: policy.KindWeirNetworkPolicy, APIVersion: k8s.WeirNetworkPolicyResource.GroupVersion().String(),
		Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion,
	}
}

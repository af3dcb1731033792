package k8s

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/weirnet/weir/internal/k8s/apis/weirv1alpha1"
	"github.com/weirnet/weir/internal/policy"
)

// statusFieldManager names the agents in the objects' managed fields.
const statusFieldManager = "weir-agent"

// Nodes is the cached nodes, converted, by name.
func (w *Watcher) Nodes() []Node {
	var out []Node
	for _, o := range w.nodes.GetStore().List() {
		if n, ok := o.(*corev1.Node); ok {
			out = append(out, nodeFrom(n))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ClusterPolicyObjects is the cached policies the agents write a status
// for, with their status: the cluster policies of both kinds and the
// WeirNetworkPolicies, sorted by kind, then namespace and name; nil
// without a dynamic client.
func (w *Watcher) ClusterPolicyObjects() []ClusterPolicyObject {
	if w.clusterPolicies == nil {
		return nil
	}
	var out []ClusterPolicyObject
	for _, o := range w.clusterPolicies.GetStore().List() {
		if p, ok := o.(*npav1alpha2.ClusterNetworkPolicy); ok {
			out = append(out, ClusterPolicyObject{Kind: policy.KindClusterNetworkPolicy, Name: p.Name,
				Generation: p.Generation, ResourceVersion: p.ResourceVersion, Conditions: p.Status.Conditions, object: p})
		}
	}
	for _, o := range w.weirClusterPolicies.GetStore().List() {
		if p, ok := o.(*weirv1alpha1.WeirClusterNetworkPolicy); ok {
			out = append(out, ClusterPolicyObject{Kind: policy.KindWeirClusterNetworkPolicy, Name: p.Name,
				Generation: p.Generation, ResourceVersion: p.ResourceVersion, Conditions: p.Status.Conditions, object: p})
		}
	}
	if w.weirPolicies != nil {
		for _, o := range w.weirPolicies.GetStore().List() {
			if p, ok := o.(*weirv1alpha1.WeirNetworkPolicy); ok {
				out = append(out, ClusterPolicyObject{Kind: policy.KindWeirNetworkPolicy, Namespace: p.Namespace, Name: p.Name,
					Generation: p.Generation, ResourceVersion: p.ResourceVersion, Conditions: p.Status.Conditions, object: p})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Ref() < out[j].Ref()
	})
	return out
}

// PolicyStatusChanges signals, through one slot, each change to a Node or
// a cluster policy: what the policies' status is computed from. Each
// call registers handlers and returns a new channel.
func (w *Watcher) PolicyStatusChanges() <-chan struct{} {
	ch := make(chan struct{}, 1)
	poke := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { poke() },
		UpdateFunc: func(any, any) { poke() },
		DeleteFunc: func(any) { poke() },
	}
	// Registering a handler only fails on a stopped informer.
	for _, inf := range []cache.SharedIndexInformer{w.nodes, w.clusterPolicies, w.weirClusterPolicies, w.weirPolicies} {
		if inf != nil {
			_, _ = inf.AddEventHandler(h)
		}
	}
	return ch
}

// PolicyStatusRound is what one SyncPolicyStatus did.
type PolicyStatusRound struct {
	// Writer is whether self is the elected writer.
	Writer bool
	// Written counts the status updates made.
	Written int
	// Pending is whether another round is wanted soon: a policy is not
	// programmed everywhere yet, or an update lost a race or failed.
	Pending bool
}

// SyncPolicyStatus brings the cluster policies' conditions up to date
// with what the nodes' agents report, if self is the elected writer (see
// PolicyStatusWriter). It updates only the policies whose conditions
// change. An update that conflicts with a newer version of the object is
// skipped: the round after the cache has caught up retries it.
func SyncPolicyStatus(ctx context.Context, dyn dynamic.Interface, self string, nodes []Node, policies []ClusterPolicyObject, now time.Time) (PolicyStatusRound, error) {
	var r PolicyStatusRound
	if PolicyStatusWriter(nodes, now) != self {
		return r, nil
	}
	r.Writer = true
	var errs []error
	for _, p := range policies {
		conds, changed := PolicyConditions(p, nodes, now)
		if c := meta.FindStatusCondition(conds, ConditionProgrammed); c == nil || c.Status != metav1.ConditionTrue {
			r.Pending = true
		}
		if !changed {
			continue
		}
		err := updatePolicyConditions(ctx, dyn, p, conds)
		switch {
		case err == nil:
			r.Written++
		case apierrors.IsNotFound(err):
			// Deleted since the cache saw it.
		case apierrors.IsConflict(err):
			r.Pending = true
		default:
			r.Pending = true
			errs = append(errs, err)
		}
	}
	return r, errors.Join(errs...)
}

// policyKinds maps a cluster policy kind to its resource and API kind.
var policyKinds = map[string]struct {
	gvr schema.GroupVersionResource
	gvk schema.GroupVersionKind
}{
	policy.KindClusterNetworkPolicy: {ClusterPolicyResource,
		npav1alpha2.SchemeGroupVersion.WithKind(policy.KindClusterNetworkPolicy)},
	policy.KindWeirClusterNetworkPolicy: {WeirClusterPolicyResource,
		weirv1alpha1.SchemeGroupVersion.WithKind(policy.KindWeirClusterNetworkPolicy)},
	policy.KindWeirNetworkPolicy: {WeirNetworkPolicyResource,
		weirv1alpha1.SchemeGroupVersion.WithKind(policy.KindWeirNetworkPolicy)},
}

// updatePolicyConditions replaces p's status conditions, on the version
// of the object p was read from.
func updatePolicyConditions(ctx context.Context, dyn dynamic.Interface, p ClusterPolicyObject, conds []metav1.Condition) error {
	kind, ok := policyKinds[p.Kind]
	if !ok {
		return fmt.Errorf("update status of %s: unknown kind", p.Ref())
	}
	u := &unstructured.Unstructured{Object: map[string]any{}}
	if p.object != nil {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(p.object)
		if err != nil {
			return fmt.Errorf("update status of %s: %w", p.Ref(), err)
		}
		u.Object = m
	}
	u.SetGroupVersionKind(kind.gvk)
	u.SetNamespace(p.Namespace)
	u.SetName(p.Name)
	u.SetResourceVersion(p.ResourceVersion)
	status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&npav1alpha2.ClusterNetworkPolicyStatus{Conditions: conds})
	if err != nil {
		return fmt.Errorf("update status of %s: %w", p.Ref(), err)
	}
	u.Object["status"] = status
	var res dynamic.ResourceInterface = dyn.Resource(kind.gvr)
	if p.Namespace != "" {
		res = dyn.Resource(kind.gvr).Namespace(p.Namespace)
	}
	if _, err := res.UpdateStatus(ctx, u, metav1.UpdateOptions{FieldManager: statusFieldManager}); err != nil {
		return fmt.Errorf("update status of %s: %w", p.Ref(), err)
	}
	return nil
}

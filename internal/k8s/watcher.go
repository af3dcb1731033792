package k8s

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/weirnet/weir/internal/k8s/apis/weirv1alpha1"
	"github.com/weirnet/weir/internal/policy"
)

// Watcher keeps informers on Nodes, Pods, Namespaces, NetworkPolicies,
// WeirNetworkPolicies, Services, EndpointSlices, SecurityIdentities and
// the cluster policies of both kinds and hands the agent a fresh Snapshot
// after each burst of changes; Services and EndpointSlices come apart from it, one changed
// Service at a time (ServiceUpdates). While the API server is unreachable the informers keep their
// last state and retry; nothing is delivered until they have news, so the
// datapath stays as it was.
type Watcher struct {
	nodeName   string
	factory    informers.SharedInformerFactory
	dynFactory dynamicinformer.DynamicSharedInformerFactory
	nodes      cache.SharedIndexInformer
	pods       cache.SharedIndexInformer
	namespaces cache.SharedIndexInformer
	policies   cache.SharedIndexInformer
	services   cache.SharedIndexInformer
	slices     cache.SharedIndexInformer
	identities cache.SharedIndexInformer // nil without a dynamic client
	// weirPolicies holds WeirNetworkPolicies, stored typed; nil without
	// a dynamic client.
	weirPolicies cache.SharedIndexInformer
	// Both cluster policy kinds, stored typed; nil without a dynamic
	// client.
	clusterPolicies     cache.SharedIndexInformer
	weirClusterPolicies cache.SharedIndexInformer
	// crds are the informers on Weir's custom resources.
	crds []*crdWatch
	// changed has one slot: any number of events between two deliveries
	// become one snapshot.
	changed chan struct{}
	memo    podMemo
	// svc collects Service and EndpointSlice changes, apart from the
	// snapshot.
	svc serviceChanges
}

// podMemo keeps each pod's conversion until the pod changes: a snapshot is
// taken after every change anywhere, and re-reading a thousand unchanged
// pods each time would delay the one change that matters.
type podMemo struct {
	mu   sync.Mutex
	byID map[types.UID]memoPod
}

type memoPod struct {
	version string
	key     string
	pod     Pod
}

// convert returns p converted, reusing the last conversion of the same
// resource version. seen collects the UIDs visited, for prune.
func (m *podMemo) convert(p *corev1.Pod, seen map[types.UID]bool) memoPod {
	seen[p.UID] = true
	if c, ok := m.byID[p.UID]; ok && c.version == p.ResourceVersion && p.ResourceVersion != "" {
		return c
	}
	pod := podFrom(p)
	c := memoPod{version: p.ResourceVersion, key: pod.Key(), pod: pod}
	m.byID[p.UID] = c
	return c
}

// prune forgets the pods no longer in the cache.
func (m *podMemo) prune(seen map[types.UID]bool) {
	for id := range m.byID {
		if !seen[id] {
			delete(m.byID, id)
		}
	}
}

// NewWatcher sets up (but does not start) the informers. dyn may be nil,
// and then identities, WeirNetworkPolicies and cluster policies are not
// watched.
func NewWatcher(client kubernetes.Interface, dyn dynamic.Interface, nodeName string, resync time.Duration) *Watcher {
	w := &Watcher{nodeName: nodeName, changed: make(chan struct{}, 1), memo: podMemo{byID: map[types.UID]memoPod{}}}
	w.factory = informers.NewSharedInformerFactory(client, resync)
	w.nodes = w.factory.Core().V1().Nodes().Informer()
	// Every pod, not only this node's: the ipcache maps remote pods to
	// their identities, and egress named ports resolve on them.
	w.pods = w.factory.Core().V1().Pods().Informer()
	w.namespaces = w.factory.Core().V1().Namespaces().Informer()
	w.policies = w.factory.Networking().V1().NetworkPolicies().Informer()
	w.services = w.factory.Core().V1().Services().Informer()
	w.slices = w.factory.Discovery().V1().EndpointSlices().Informer()
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { w.poke() },
		UpdateFunc: func(any, any) { w.poke() },
		DeleteFunc: func(any) { w.poke() },
	}
	// Registering a handler only fails on a stopped informer.
	for _, inf := range []cache.SharedIndexInformer{w.nodes, w.pods, w.namespaces, w.policies} {
		_, _ = inf.AddEventHandler(h)
	}
	w.watchServices()
	if dyn != nil {
		w.dynFactory = dynamicinformer.NewDynamicSharedInformerFactory(dyn, resync)
		w.identities = w.watchCRD(IdentityResource, "crds.yaml", nil, h).informer
		w.clusterPolicies = w.watchCRD(ClusterPolicyResource, "crd-clusternetworkpolicies.yaml",
			typed[npav1alpha2.ClusterNetworkPolicy](), h).informer
		w.weirClusterPolicies = w.watchCRD(WeirClusterPolicyResource, "crd-weirclusternetworkpolicies.yaml",
			typed[weirv1alpha1.WeirClusterNetworkPolicy](), h).informer
		w.weirPolicies = w.watchCRD(WeirNetworkPolicyResource, "crd-weirnetworkpolicies.yaml",
			typed[weirv1alpha1.WeirNetworkPolicy](), h).informer
	}
	return w
}

// Poke asks for one more delivery, as if something had changed.
func (w *Watcher) Poke() { w.poke() }

func (w *Watcher) poke() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// Start runs the informers until ctx ends.
func (w *Watcher) Start(ctx context.Context) {
	w.factory.Start(ctx.Done())
	if w.dynFactory != nil {
		w.dynFactory.Start(ctx.Done())
	}
}

func (w *Watcher) informers() []cache.SharedIndexInformer {
	out := []cache.SharedIndexInformer{w.nodes, w.pods, w.namespaces, w.policies, w.services, w.slices}
	for _, c := range w.crds {
		out = append(out, c.informer)
	}
	return out
}

// WaitSynced blocks until every cache holds a full list, or ctx ends, or
// a custom resource turns out not to be installed (see SyncErr).
func (w *Watcher) WaitSynced(ctx context.Context) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !w.Synced() {
		if err := w.SyncErr(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for informers: %w", ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// SyncErr says why the caches cannot sync when the API server has said
// so: a kind whose CRD is not installed (ErrCRDMissing). The informers
// keep retrying, and sync once the CRD is applied.
func (w *Watcher) SyncErr() error {
	var errs []error
	for _, c := range w.crds {
		if err := c.err(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Synced reports whether every cache has listed at least once (and the
// Service changes have taken in every Service of that list).
func (w *Watcher) Synced() bool {
	for _, inf := range w.informers() {
		if !inf.HasSynced() {
			return false
		}
	}
	return w.svc.synced()
}

// Changes delivers a signal after each burst of changes.
func (w *Watcher) Changes() <-chan struct{} { return w.changed }

// Snapshot is the informers' current state. Pods of successive snapshots
// share their label maps: callers read them and never write.
func (w *Watcher) Snapshot() Snapshot {
	s := Snapshot{Namespaces: map[string]map[string]string{}, Identities: map[string]policy.Identity{}}
	s.Nodes = w.Nodes()
	var cluster, local []memoPod
	seen := map[types.UID]bool{}
	w.memo.mu.Lock()
	for _, o := range w.pods.GetStore().List() {
		p, ok := o.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" {
			continue // not scheduled: no address, no endpoint
		}
		c := w.memo.convert(p, seen)
		cluster = append(cluster, c)
		if p.Spec.NodeName == w.nodeName {
			local = append(local, c)
		}
	}
	w.memo.prune(seen)
	w.memo.mu.Unlock()
	s.ClusterPods, s.Pods = sortedPods(cluster), sortedPods(local)
	for _, o := range w.namespaces.GetStore().List() {
		if ns, ok := o.(*corev1.Namespace); ok {
			s.Namespaces[ns.Name] = ns.Labels
		}
	}
	s.Policies, s.HTTP = w.namespacedPolicies()
	if w.identities != nil {
		s.IdentityObjects = identitiesFrom(w.identities.GetStore().List())
		for _, id := range s.IdentityObjects {
			key := id.Labels.Key()
			// Two objects for one label set only after a lost race or by
			// hand: the lowest number wins everywhere.
			if have, ok := s.Identities[key]; !ok || id.ID < have {
				s.Identities[key] = id.ID
			}
		}
	}
	if w.clusterPolicies != nil {
		s.ClusterPolicies = clusterPoliciesFrom(w.clusterPolicies.GetStore().List(), w.weirClusterPolicies.GetStore().List())
	}
	return s
}

// namespacedPolicies is the cached NetworkPolicies and WeirNetworkPolicies,
// the latter read as NetworkPolicies with their HTTP rules beside them
// (see Snapshot.HTTP), sorted by namespace/name. The compiler keeps the
// order of two policies of one name (a NetworkPolicy and a
// WeirNetworkPolicy), so that order is fixed here too: the NetworkPolicy
// first, whatever order the caches list them in.
func (w *Watcher) namespacedPolicies() ([]*networkingv1.NetworkPolicy, map[*networkingv1.NetworkPolicy]*policy.PolicyHTTP) {
	var out []*networkingv1.NetworkPolicy
	for _, o := range w.policies.GetStore().List() {
		if p, ok := o.(*networkingv1.NetworkPolicy); ok {
			out = append(out, p)
		}
	}
	http := map[*networkingv1.NetworkPolicy]*policy.PolicyHTTP{}
	if w.weirPolicies != nil {
		for _, o := range w.weirPolicies.GetStore().List() {
			if p, ok := o.(*weirv1alpha1.WeirNetworkPolicy); ok {
				np, h := WeirNetworkPolicyToPolicy(p)
				out = append(out, np)
				http[np] = h
			}
		}
	}
	// Stable, and each kind's names unique in a namespace: every
	// NetworkPolicy, appended first, stays before its WeirNetworkPolicy
	// namesake.
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out, http
}

// sortedPods orders pods by namespace/name.
func sortedPods(ps []memoPod) []Pod {
	sort.Slice(ps, func(i, j int) bool { return ps[i].key < ps[j].key })
	var out []Pod
	for _, c := range ps {
		out = append(out, c.pod)
	}
	return out
}

func identitiesFrom(objs []any) []IdentityObject {
	var out []IdentityObject
	for _, o := range objs {
		if u, ok := o.(*unstructured.Unstructured); ok {
			if id, ok := identityFrom(u); ok {
				out = append(out, id)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

package k8s

import (
	"context"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Watcher keeps informers on every Node and on this node's Pods and hands
// the agent a fresh Snapshot after each burst of changes. While the API
// server is unreachable the informers keep their last state and retry;
// nothing is delivered until they have news, so the datapath stays as it
// was.
type Watcher struct {
	nodeName string
	factory  informers.SharedInformerFactory
	podsF    informers.SharedInformerFactory
	nodes    cache.SharedIndexInformer
	pods     cache.SharedIndexInformer
	// changed has one slot: any number of events between two deliveries
	// become one snapshot.
	changed chan struct{}
}

// NewWatcher sets up (but does not start) the informers.
func NewWatcher(client kubernetes.Interface, nodeName string, resync time.Duration) *Watcher {
	w := &Watcher{nodeName: nodeName, changed: make(chan struct{}, 1)}
	w.factory = informers.NewSharedInformerFactory(client, resync)
	w.podsF = informers.NewSharedInformerFactoryWithOptions(client, resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
		}))
	w.nodes = w.factory.Core().V1().Nodes().Informer()
	w.pods = w.podsF.Core().V1().Pods().Informer()
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { w.poke() },
		UpdateFunc: func(any, any) { w.poke() },
		DeleteFunc: func(any) { w.poke() },
	}
	// Registering a handler only fails on a stopped informer.
	_, _ = w.nodes.AddEventHandler(h)
	_, _ = w.pods.AddEventHandler(h)
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
	w.podsF.Start(ctx.Done())
}

// WaitSynced blocks until both caches hold a full list, or ctx ends.
func (w *Watcher) WaitSynced(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), w.nodes.HasSynced, w.pods.HasSynced) {
		return fmt.Errorf("wait for node and pod informers: %w", ctx.Err())
	}
	return nil
}

// Synced reports whether both caches have listed at least once.
func (w *Watcher) Synced() bool { return w.nodes.HasSynced() && w.pods.HasSynced() }

// Changes delivers a signal after each burst of changes.
func (w *Watcher) Changes() <-chan struct{} { return w.changed }

// Snapshot is the informers' current state.
func (w *Watcher) Snapshot() Snapshot {
	var s Snapshot
	for _, o := range w.nodes.GetStore().List() {
		if n, ok := o.(*corev1.Node); ok {
			s.Nodes = append(s.Nodes, nodeFrom(n))
		}
	}
	for _, o := range w.pods.GetStore().List() {
		p, ok := o.(*corev1.Pod)
		if !ok || p.Spec.NodeName != w.nodeName {
			continue
		}
		s.Pods = append(s.Pods, podFrom(p))
	}
	sort.Slice(s.Nodes, func(i, j int) bool { return s.Nodes[i].Name < s.Nodes[j].Name })
	sort.Slice(s.Pods, func(i, j int) bool { return s.Pods[i].Key() < s.Pods[j].Key() })
	return s
}

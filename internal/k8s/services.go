package k8s

import (
	"cmp"
	"slices"
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// ServiceUpdate is the current state of a Service whose object or
// EndpointSlices changed: the Service (nil once it is deleted) and all of
// its EndpointSlices.
type ServiceUpdate struct {
	Key     string // namespace/name
	Service *corev1.Service
	Slices  []*discoveryv1.EndpointSlice
}

// sliceServiceIndex indexes EndpointSlices by their Service's key.
const sliceServiceIndex = "service"

// serviceChanges collects the Services changed since the last delivery.
// Service and EndpointSlice events go here rather than into the snapshot:
// a change to one of 5,000 Services then costs one Service's work, not a
// snapshot of the whole cluster.
type serviceChanges struct {
	mu    sync.Mutex
	dirty map[string]bool
	// signal has one slot: any number of changes between two deliveries
	// become one.
	signal chan struct{}
	// handlers are the Service and EndpointSlice informers' handler
	// registrations.
	handlers []cache.ResourceEventHandlerRegistration
	// slowMark, set by tests, runs before each mark: handlers that lag
	// far behind their informers' stores.
	slowMark func()
}

func (sc *serviceChanges) mark(keys ...string) {
	if sc.slowMark != nil {
		sc.slowMark()
	}
	sc.mu.Lock()
	for _, k := range keys {
		if k != "" {
			sc.dirty[k] = true
		}
	}
	sc.mu.Unlock()
	select {
	case sc.signal <- struct{}{}:
	default:
	}
}

func (sc *serviceChanges) take() []string {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	out := make([]string, 0, len(sc.dirty))
	for k := range sc.dirty {
		out = append(out, k)
	}
	clear(sc.dirty)
	sort.Strings(out)
	return out
}

// watchServices sets up w.svc and routes the Service and EndpointSlice
// informers' events to it. It runs before the informers start.
func (w *Watcher) watchServices() {
	w.svc = serviceChanges{dirty: map[string]bool{}, signal: make(chan struct{}, 1)}
	// Adding an indexer only fails on a started informer.
	_ = w.slices.AddIndexers(cache.Indexers{sliceServiceIndex: func(obj any) ([]string, error) {
		if k := sliceService(obj); k != "" {
			return []string{k}, nil
		}
		return nil, nil
	}})
	// Synced waits for these handlers too: an informer's store is full
	// before its handlers have seen every object, and the first
	// ServiceUpdates must name every Service.
	reg, _ := w.services.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.svc.mark(objectKey(obj)) },
		UpdateFunc: func(_, obj any) { w.svc.mark(objectKey(obj)) },
		DeleteFunc: func(obj any) { w.svc.mark(objectKey(obj)) },
	})
	w.svc.handlers = append(w.svc.handlers, reg)
	reg, _ = w.slices.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { w.svc.mark(sliceService(obj)) },
		// A slice relabelled to another Service changes both.
		UpdateFunc: func(old, obj any) { w.svc.mark(sliceService(old), sliceService(obj)) },
		DeleteFunc: func(obj any) { w.svc.mark(sliceService(obj)) },
	})
	w.svc.handlers = append(w.svc.handlers, reg)
}

// synced says both handlers have been handed every object of their
// informer's first list.
func (sc *serviceChanges) synced() bool {
	for _, h := range sc.handlers {
		if h == nil || !h.HasSynced() {
			return false
		}
	}
	return true
}

func objectKey(obj any) string {
	k, _ := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	return k
}

// sliceService is the key of the Service an EndpointSlice (or the
// tombstone of a deleted one) belongs to; "" for none.
func sliceService(obj any) string {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return ""
	}
	name := s.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return ""
	}
	return s.Namespace + "/" + name
}

// ServiceChanges delivers a signal after each burst of Service and
// EndpointSlice changes; ServiceUpdates says which.
func (w *Watcher) ServiceChanges() <-chan struct{} { return w.svc.signal }

// ServiceUpdates returns the Services changed since the last call, each
// as the informers hold it now. The first call after the caches synced
// returns every Service.
func (w *Watcher) ServiceUpdates() []ServiceUpdate {
	keys := w.svc.take()
	out := make([]ServiceUpdate, 0, len(keys))
	for _, key := range keys {
		u := ServiceUpdate{Key: key}
		// A store lookup fails only for an index it lacks; this one is
		// added before the informer starts.
		if obj, ok, err := w.services.GetStore().GetByKey(key); err == nil && ok {
			u.Service, _ = obj.(*corev1.Service)
		}
		objs, _ := w.slices.GetIndexer().ByIndex(sliceServiceIndex, key)
		for _, o := range objs {
			if s, ok := o.(*discoveryv1.EndpointSlice); ok {
				u.Slices = append(u.Slices, s)
			}
		}
		// The informer's order is a map's: sorted, a Service's slices
		// always merge alike.
		slices.SortFunc(u.Slices, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
		out = append(out, u)
	}
	return out
}

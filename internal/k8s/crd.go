package k8s

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
)

// ErrCRDMissing means the API server does not serve a kind the agent
// watches: its CustomResourceDefinition, one of deploy/crd*.yaml, is not
// installed.
var ErrCRDMissing = errors.New("custom resource definition not installed")

// crdWatch is an informer on a kind that one of Weir's manifests installs.
// An informer on a kind the API server does not serve retries its list
// forever and never syncs; crdWatch remembers the API server's answer so
// the wait can end with an error that names the manifest to apply.
type crdWatch struct {
	gvr      schema.GroupVersionResource
	manifest string // under deploy/
	informer cache.SharedIndexInformer
	missing  atomic.Bool
}

// watchCRD sets up an informer on gvr, installed by deploy/<manifest>,
// storing its objects as transform makes them (nil: unstructured). It
// must run before the factory starts.
func (w *Watcher) watchCRD(gvr schema.GroupVersionResource, manifest string, transform cache.TransformFunc, h cache.ResourceEventHandler) *crdWatch {
	c := &crdWatch{gvr: gvr, manifest: manifest, informer: w.dynFactory.ForResource(gvr).Informer()}
	// Both setters only fail on a started informer.
	_ = c.informer.SetWatchErrorHandlerWithContext(c.watchError)
	if transform != nil {
		_ = c.informer.SetTransform(transform)
	}
	_, _ = c.informer.AddEventHandler(h)
	w.crds = append(w.crds, c)
	return c
}

// watchError records whether the kind is missing, and logs as informers
// do without a handler of their own.
func (c *crdWatch) watchError(ctx context.Context, r *cache.Reflector, err error) {
	c.missing.Store(apierrors.IsNotFound(err))
	cache.DefaultWatchErrorHandler(ctx, r, err)
}

// err is why the informer has not synced, when the API server said why.
func (c *crdWatch) err() error {
	if c.informer.HasSynced() || !c.missing.Load() {
		return nil
	}
	return fmt.Errorf("watch %s.%s: %w: apply deploy/%s", c.gvr.Resource, c.gvr.Group, ErrCRDMissing, c.manifest)
}

// typed is a transform storing a custom resource's objects as their Go
// type T: converted once as they arrive, not at every snapshot.
func typed[T any]() cache.TransformFunc {
	return func(o any) (any, error) {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			return o, nil // converted already, or a deletion tombstone
		}
		out := new(T)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
			// The CRD's schema makes this unreachable. An error here
			// would fail the whole list, and with it every other
			// object of the kind: keep this one as it came, and the
			// snapshot leaves it out.
			return u, nil
		}
		return out, nil
	}
}

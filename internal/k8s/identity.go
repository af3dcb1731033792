package k8s

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/weirnet/weir/internal/policy"
)

// IdentityResource is the SecurityIdentity custom resource (deploy/crds.yaml).
var IdentityResource = schema.GroupVersionResource{Group: "weir.io", Version: "v1alpha1", Resource: "securityidentities"}

// identityNamespaceLabel lets `kubectl get wid -l weir.io/namespace=x` find
// a namespace's identities.
const identityNamespaceLabel = "weir.io/namespace"

// ErrIdentitySpaceFull means every number an allocation may try is taken.
var ErrIdentitySpaceFull = errors.New("no free security identity")

// maxIdentityAttempts bounds the probing of one allocation.
const maxIdentityAttempts = 64

// IdentityObject is a SecurityIdentity as the agent reads it.
type IdentityObject struct {
	ID      policy.Identity
	Labels  policy.Labels
	UID     types.UID
	Created time.Time
}

// identityFrom reads an unstructured SecurityIdentity; ok is false for an
// object that is not one Weir could have written.
func identityFrom(u *unstructured.Unstructured) (IdentityObject, bool) {
	n, err := strconv.ParseUint(u.GetName(), 10, 32)
	if err != nil || policy.Identity(n) < policy.MinClusterIdentity || policy.Identity(n) > policy.MaxClusterIdentity {
		return IdentityObject{}, false
	}
	labels, found, err := unstructured.NestedStringSlice(u.Object, "securityLabels")
	if err != nil || !found {
		return IdentityObject{}, false
	}
	return IdentityObject{ID: policy.Identity(n), Labels: labels, UID: u.GetUID(),
		Created: u.GetCreationTimestamp().Time}, true
}

func identityObject(id policy.Identity, labels policy.Labels) *unstructured.Unstructured {
	items := make([]any, len(labels))
	for i, l := range labels {
		items[i] = l
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion":     IdentityResource.GroupVersion().String(),
		"kind":           "SecurityIdentity",
		"securityLabels": items,
	}}
	u.SetName(strconv.FormatUint(uint64(id), 10))
	for _, l := range labels {
		if v, ok := strings.CutPrefix(l, policy.LabelNamespace+"="); ok {
			u.SetLabels(map[string]string{identityNamespaceLabel: v})
		}
	}
	return u
}

// AllocateIdentity returns the cluster identity of labels, creating it if
// no agent has. It tries policy.CandidateIdentity's numbers in order: a
// number already holding these labels is the answer (another agent won
// the race), one holding other labels is skipped.
func AllocateIdentity(ctx context.Context, client dynamic.Interface, labels policy.Labels) (policy.Identity, error) {
	res := client.Resource(IdentityResource)
	key := labels.Key()
	for attempt := 0; attempt < maxIdentityAttempts; attempt++ {
		id := policy.CandidateIdentity(key, attempt)
		_, err := res.Create(ctx, identityObject(id, labels), metav1.CreateOptions{})
		if err == nil {
			return id, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return 0, fmt.Errorf("create security identity %d: %w", id, err)
		}
		u, err := res.Get(ctx, strconv.FormatUint(uint64(id), 10), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			attempt-- // collected between our create and get: try it again
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("get security identity %d: %w", id, err)
		}
		if have, ok := identityFrom(u); ok && have.Labels.Key() == key {
			return id, nil
		}
	}
	return 0, fmt.Errorf("labels %q after %d numbers: %w", key, maxIdentityAttempts, ErrIdentitySpaceFull)
}

// IdentityCollector deletes identities no pod has used for a grace period.
// Every agent runs one; the grace period covers an agent whose pod list is
// a little behind, and a delete is conditional on the object's UID, so an
// identity re-created meanwhile is never removed.
type IdentityCollector struct {
	client dynamic.Interface
	grace  time.Duration
	now    func() time.Time

	mu     sync.Mutex
	unused map[policy.Identity]time.Time // first seen unused
}

// NewIdentityCollector returns a collector with the given grace period.
func NewIdentityCollector(client dynamic.Interface, grace time.Duration) *IdentityCollector {
	return &IdentityCollector{client: client, grace: grace, now: time.Now, unused: map[policy.Identity]time.Time{}}
}

// Collect looks at every identity once: inUse holds the label keys of
// every pod in the cluster. It returns the identities it deleted.
func (c *IdentityCollector) Collect(ctx context.Context, all []IdentityObject, inUse map[string]bool) ([]policy.Identity, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	seen := map[policy.Identity]bool{}
	var deleted []policy.Identity
	var errs []error
	for _, o := range all {
		seen[o.ID] = true
		if inUse[o.Labels.Key()] {
			delete(c.unused, o.ID)
			continue
		}
		since, ok := c.unused[o.ID]
		if !ok {
			c.unused[o.ID] = now
			continue
		}
		if now.Sub(since) < c.grace || now.Sub(o.Created) < c.grace {
			continue
		}
		uid := o.UID
		err := c.client.Resource(IdentityResource).Delete(ctx, strconv.FormatUint(uint64(o.ID), 10),
			metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		switch {
		case err == nil:
			deleted = append(deleted, o.ID)
			delete(c.unused, o.ID)
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			delete(c.unused, o.ID) // gone or replaced: nothing to do
		default:
			errs = append(errs, fmt.Errorf("delete security identity %d: %w", o.ID, err))
		}
	}
	for id := range c.unused {
		if !seen[id] {
			delete(c.unused, id)
		}
	}
	return deleted, errors.Join(errs...)
}

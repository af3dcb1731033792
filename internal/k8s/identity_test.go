package k8s

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/uuid"
	dynfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/weirnet/weir/internal/policy"
)

func newFakeDynamic(objs ...runtime.Object) *dynfake.FakeDynamicClient {
	c := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{IdentityResource: "SecurityIdentityList"}, objs...)
	// The fake tracker sets no UIDs or creation times; the API server does.
	c.PrependReactor("create", "securityidentities", func(a k8stesting.Action) (bool, runtime.Object, error) {
		o := a.(k8stesting.CreateAction).GetObject().(metav1.Object)
		o.SetUID(uuid.NewUUID())
		o.SetCreationTimestamp(metav1.Now())
		return false, nil, nil
	})
	return c
}

func labelsOf(ns, app string) policy.Labels {
	return policy.IdentityLabels(policy.Namespace{Name: ns}, map[string]string{"app": app})
}

func TestAllocateIdentityIsIdempotentAndSkipsTakenNumbers(t *testing.T) {
	web, db := labelsOf("default", "web"), labelsOf("default", "db")
	// The web label set's first candidate already holds db's labels.
	taken := identityObject(policy.CandidateIdentity(web.Key(), 0), db)
	c := newFakeDynamic(taken)
	ctx := context.Background()
	id, err := AllocateIdentity(ctx, c, web)
	if err != nil {
		t.Fatal(err)
	}
	if id != policy.CandidateIdentity(web.Key(), 1) {
		t.Fatalf("got %d, want the second candidate %d", id, policy.CandidateIdentity(web.Key(), 1))
	}
	again, err := AllocateIdentity(ctx, c, web) // another agent, same labels
	if err != nil || again != id {
		t.Fatalf("second allocation %d, %v; want %d", again, err, id)
	}
	list, err := c.Resource(IdentityResource).List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 2 {
		t.Fatalf("%d objects (%v), want 2", len(list.Items), err)
	}
	if got := list.Items[1].GetLabels()[identityNamespaceLabel]; got != "default" && list.Items[0].GetLabels()[identityNamespaceLabel] != "default" {
		t.Errorf("namespace label missing")
	}
}

func TestAllocateIdentityFullSpace(t *testing.T) {
	web := labelsOf("default", "web")
	var objs []runtime.Object
	for i := 0; i < maxIdentityAttempts; i++ {
		objs = append(objs, identityObject(policy.CandidateIdentity(web.Key(), i), labelsOf("other", string(rune('a'+i%26))+string(rune('a'+i/26)))))
	}
	_, err := AllocateIdentity(context.Background(), newFakeDynamic(objs...), web)
	if !errors.Is(err, ErrIdentitySpaceFull) {
		t.Fatalf("err = %v, want ErrIdentitySpaceFull", err)
	}
}

func TestIdentityCollectorWaitsForGrace(t *testing.T) {
	web, old := labelsOf("default", "web"), labelsOf("default", "gone")
	c := newFakeDynamic()
	ctx := context.Background()
	for _, l := range []policy.Labels{web, old} {
		if _, err := AllocateIdentity(ctx, c, l); err != nil {
			t.Fatal(err)
		}
	}
	list := func() []IdentityObject {
		l, err := c.Resource(IdentityResource).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var objs []any
		for i := range l.Items {
			objs = append(objs, &l.Items[i])
		}
		return identitiesFrom(objs)
	}
	now := time.Now()
	col := NewIdentityCollector(c, time.Minute)
	col.now = func() time.Time { return now }
	inUse := map[string]bool{web.Key(): true}
	for _, step := range []time.Duration{0, 30 * time.Second, 61 * time.Second} {
		now = now.Add(step)
		deleted, err := col.Collect(ctx, list(), inUse)
		if err != nil {
			t.Fatal(err)
		}
		if want := step > time.Minute; (len(deleted) == 1) != want {
			t.Fatalf("after %v: deleted %v, want deletion=%v", step, deleted, want)
		}
	}
	left := list()
	if len(left) != 1 || left[0].Labels.Key() != web.Key() {
		t.Fatalf("left %+v, want only the used identity", left)
	}
}

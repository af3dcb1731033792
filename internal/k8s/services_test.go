package k8s

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

func testService(name string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.9"}}
}

func testSlice(name, svc string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
}

// nextServiceUpdates waits for a Service change and returns the updates
// of the keys it names, by key.
func nextServiceUpdates(t *testing.T, ctx context.Context, w *Watcher, keys ...string) map[string]ServiceUpdate {
	t.Helper()
	got := map[string]ServiceUpdate{}
	for {
		for _, u := range w.ServiceUpdates() {
			got[u.Key] = u
		}
		done := true
		for _, k := range keys {
			_, ok := got[k]
			done = done && ok
		}
		if done {
			return got
		}
		select {
		case <-w.ServiceChanges():
		case <-ctx.Done():
			t.Fatalf("no update for %v; have %v", keys, got)
		}
	}
}

// TestWatcherDeliversOneServiceAtATime: Service and EndpointSlice changes
// come as updates of the Services they touch, each with the Service and
// all of its slices as they are now (nil and none once deleted; a slice
// relabelled to another Service updates both), and never as snapshots.
func TestWatcherDeliversOneServiceAtATime(t *testing.T) {
	c := fake.NewSimpleClientset(testService("web"), testService("db"), testSlice("web-b", "web"), testSlice("web-a", "web"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w := NewWatcher(c, nil, "n1", 0)
	w.Start(ctx)
	if err := w.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	got := nextServiceUpdates(t, ctx, w, "shop/web", "shop/db")
	web := got["shop/web"]
	if web.Service == nil || len(web.Slices) != 2 || web.Slices[0].Name != "web-a" || web.Slices[1].Name != "web-b" {
		t.Fatalf("first update of shop/web: %+v, want the Service and both slices, sorted", web)
	}
	if db := got["shop/db"]; db.Service == nil || len(db.Slices) != 0 {
		t.Fatalf("first update of shop/db: %+v, want the Service without slices", db)
	}
	drain(w)

	moved := testSlice("web-b", "db")
	if _, err := c.DiscoveryV1().EndpointSlices("shop").Update(ctx, moved, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got = nextServiceUpdates(t, ctx, w, "shop/web", "shop/db")
	if web := got["shop/web"]; len(web.Slices) != 1 || web.Slices[0].Name != "web-a" {
		t.Errorf("after web-b moved to db, web has %+v", web.Slices)
	}
	if db := got["shop/db"]; len(db.Slices) != 1 || db.Slices[0].Name != "web-b" {
		t.Errorf("after web-b moved to db, db has %+v", db.Slices)
	}

	if err := c.CoreV1().Services("shop").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	got = nextServiceUpdates(t, ctx, w, "shop/web")
	if web := got["shop/web"]; web.Service != nil {
		t.Errorf("after the delete: %+v, want no Service", web)
	}
	select {
	case <-w.Changes():
		t.Error("Service changes signalled a snapshot")
	default:
	}
	if u := w.ServiceUpdates(); len(u) != 0 {
		t.Errorf("updates with nothing changed: %+v", u)
	}
}

// TestWatcherSyncedMeansEveryServiceIsNamed: once the watcher says it has
// synced, the first ServiceUpdates names every Service of the first list,
// even with handlers that lag far behind the informers' stores (Synced
// waits for them), so an agent's first write never leaves Services out.
func TestWatcherSyncedMeansEveryServiceIsNamed(t *testing.T) {
	for run := range 2 {
		var objs []runtime.Object
		for i := range 2000 {
			name := fmt.Sprintf("s%d", i)
			objs = append(objs, testService(name), testSlice(name+"-a", name))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		w := NewWatcher(fake.NewSimpleClientset(objs...), nil, "n1", 0)
		w.svc.slowMark = func() { time.Sleep(100 * time.Microsecond) }
		w.Start(ctx)
		if err := w.WaitSynced(ctx); err != nil {
			t.Fatal(err)
		}
		updates := w.ServiceUpdates()
		withSlice := 0
		for _, u := range updates {
			if len(u.Slices) == 1 {
				withSlice++
			}
		}
		cancel()
		if len(updates) != 2000 || withSlice != 2000 {
			t.Fatalf("run %d: first updates name %d Services (%d with their slice), want all 2000", run, len(updates), withSlice)
		}
	}
}

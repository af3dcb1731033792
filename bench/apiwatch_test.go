package main

import (
	"context"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
)

// The watch records each policy's events by type and name, once, and a
// wait for one that never comes (or after the watch ended) is an error.
func TestPolicyEvents(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	events, err := watchPolicies(ctx, c, "bench")
	if err != nil {
		t.Fatal(err)
	}
	pols := c.NetworkingV1().NetworkPolicies("bench")
	written := time.Now()
	if _, err := pols.Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "grant-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	added, err := events.arrived(watch.Added, "grant-1", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if added.Before(written) {
		t.Errorf("ADDED recorded at %v, before the write at %v", added, written)
	}
	if _, err := events.arrived(watch.Deleted, "grant-1", 50*time.Millisecond); err == nil || !strings.Contains(err.Error(), "no DELETED event") {
		t.Errorf("wait for a deletion not made: %v", err)
	}
	if err := pols.Delete(ctx, "grant-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deleted, err := events.arrived(watch.Deleted, "grant-1", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if deleted.Before(added) {
		t.Errorf("DELETED at %v before ADDED at %v", deleted, added)
	}
	if again, _ := events.arrived(watch.Added, "grant-1", time.Second); !again.Equal(added) {
		t.Errorf("ADDED time changed from %v to %v", added, again)
	}
	events.close()
	if _, err := events.arrived(watch.Added, "grant-2", time.Second); err == nil || !strings.Contains(err.Error(), "watch ended") {
		t.Errorf("wait after close: %v, want the watch ended", err)
	}
}

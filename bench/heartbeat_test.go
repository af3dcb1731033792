package main

import (
	"context"
	"io"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// Starting the heartbeat gives every virtual node a Lease held by itself;
// a renewal moves its renew time on and keeps the holder.
func TestHeartbeatLeases(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset()
	h, err := startHeartbeat(ctx, c, []string{"virt-1", "virt-2"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer h.stop()
	leases := c.CoordinationV1().Leases("kube-node-lease")
	first, err := leases.Get(ctx, "virt-2", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("virt-2 has no Lease: %v", err)
	}
	if first.Spec.HolderIdentity == nil || *first.Spec.HolderIdentity != "virt-2" || first.Spec.RenewTime == nil {
		t.Fatalf("lease spec %+v: want held by virt-2 with a renew time", first.Spec)
	}
	if err := renewLease(ctx, c, "virt-2"); err != nil {
		t.Fatal(err)
	}
	again, err := leases.Get(ctx, "virt-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if again.Spec.RenewTime.Before(first.Spec.RenewTime) || *again.Spec.HolderIdentity != "virt-2" {
		t.Fatalf("renewed lease %+v after %+v", again.Spec, first.Spec)
	}
	h.stop()
	var none *heartbeat
	none.stop() // no virtual nodes: nothing to stop
}

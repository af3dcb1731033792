package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// leaseEvery is how often a virtual node's Lease is renewed: the kubelet's
// own period, well inside the node lifecycle controller's 40 s grace.
const leaseEvery = 10 * time.Second

// heartbeat renews the node Leases of the virtual nodes, as their kubelets
// would. Without it the node lifecycle controller marks them NotReady
// 40 s after they appear and then rewrites every pod on them (Ready
// False), hundreds of pod updates that each cost every agent a pass: the
// benchmark would time policy changes against a storm of its own making,
// which a real cluster of healthy nodes does not have. (Five minutes on,
// the taint manager would evict the pods too.)
type heartbeat struct {
	cancel context.CancelFunc
	done   sync.WaitGroup
}

func startHeartbeat(ctx context.Context, c kubernetes.Interface, nodes []string, log io.Writer) (*heartbeat, error) {
	for _, n := range nodes {
		if err := renewLease(ctx, c, n); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	h := &heartbeat{cancel: cancel}
	h.done.Add(1)
	go func() {
		defer h.done.Done()
		tick := time.NewTicker(leaseEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for _, n := range nodes {
				if err := renewLease(ctx, c, n); err != nil && ctx.Err() == nil {
					fmt.Fprintf(log, "    warning: %v\n", err)
				}
			}
		}
	}()
	return h, nil
}

// stop ends the renewals; safe on a nil heartbeat.
func (h *heartbeat) stop() {
	if h == nil {
		return
	}
	h.cancel()
	h.done.Wait()
}

// renewLease creates or renews node's Lease in kube-node-lease.
func renewLease(ctx context.Context, c kubernetes.Interface, node string) error {
	leases := c.CoordinationV1().Leases("kube-node-lease")
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: node},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr(node), LeaseDurationSeconds: ptr(int32(40)),
				AcquireTime: &now, RenewTime: &now},
		}
		_, err = leases.Create(ctx, l, metav1.CreateOptions{})
	} else if err == nil {
		l.Spec.RenewTime = &now
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("renew the Lease of virtual node %s: %w", node, err)
	}
	return nil
}

package agent

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/policy"
)

// failingPolicyLoad fails ApplyPolicy while fail is set, and the next
// failNext loads; it counts loads.
type failingPolicyLoad struct {
	Datapath
	fail     atomic.Bool
	failNext atomic.Int32
	loads    atomic.Int32
}

func (f *failingPolicyLoad) ApplyPolicy(d policy.Diff, eps map[string]datapath.PolicyEndpoint) error {
	f.loads.Add(1)
	if f.fail.Load() || f.failNext.Add(-1) >= 0 {
		return errInjected
	}
	return f.Datapath.ApplyPolicy(d, eps)
}

// TestFailedPolicyLoadIsRetried: a load that fails is tried again with
// back-off, with no cluster event to prompt it, until one succeeds.
func TestFailedPolicyLoadIsRetried(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	load := &failingPolicyLoad{}
	n.stop()
	n.start(func(d Datapath) Datapath { load.Datapath = d; return load })
	a := n.agent
	load.failNext.Store(3)
	a.mu.Lock()
	a.applyPolicyLocked(k8s.Snapshot{ClusterPolicies: []*policy.ClusterPolicy{auditAndReject()}})
	failed := a.policy.lastErr != ""
	a.mu.Unlock()
	if !failed {
		t.Fatal("the injected failure was not reported")
	}
	// Retries after 100, 200 and 400 ms: the fourth load succeeds.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		a.mu.Lock()
		ok := a.policy.lastErr == ""
		a.mu.Unlock()
		if ok {
			if got := load.loads.Load(); got != 4 {
				t.Fatalf("%d loads, want 4 (one failure and three retries)", got)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("still failing after 5 s and %d loads: no retry without a cluster event", load.loads.Load())
}

// TestClusterPolicyAckFollowsTheDatapath: the acks name the generation
// of each cluster policy the datapath loaded, with the compiler's error
// for one that does not compile, and do not move while loading fails.
func TestClusterPolicyAckFollowsTheDatapath(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	load := &failingPolicyLoad{}
	n.stop()
	n.start(func(d Datapath) Datapath { load.Datapath = d; return load })
	a := n.agent
	a.policy.acked = make(chan struct{}, 1)
	apply := func(gen int64) map[string]k8s.PolicyAck {
		good := auditAndReject()
		good.Generation = gen
		bad := &policy.ClusterPolicy{Kind: policy.KindClusterNetworkPolicy, Name: "too-high", Generation: 1}
		bad.Spec.Tier, bad.Spec.Priority = npav1alpha2.AdminTier, policy.MaxClusterPriority+1
		a.mu.Lock()
		defer a.mu.Unlock()
		a.applyPolicyLocked(k8s.Snapshot{ClusterPolicies: []*policy.ClusterPolicy{good, bad}})
		return a.policy.acks
	}
	acks := apply(2)
	good, bad := acks["WeirClusterNetworkPolicy/audit-and-reject"], acks["ClusterNetworkPolicy/too-high"]
	if good.Generation != 2 || good.Error != "" || bad.Generation != 1 || !strings.Contains(bad.Error, "priority") {
		t.Fatalf("acks %+v: want audit-and-reject at 2, too-high at 1 with its priority error", acks)
	}
	load.fail.Store(true)
	if acks := apply(3); acks["WeirClusterNetworkPolicy/audit-and-reject"].Generation != 2 {
		t.Fatalf("acks %+v after a failed load, want generation 2 kept", acks)
	}
	load.fail.Store(false)
	if acks := apply(3); acks["WeirClusterNetworkPolicy/audit-and-reject"].Generation != 3 {
		t.Fatalf("acks %+v after a load, want generation 3", acks)
	}
}

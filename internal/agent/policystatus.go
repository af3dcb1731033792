package agent

import (
	"context"
	"errors"
	"maps"
	"strings"
	"time"

	"k8s.io/client-go/dynamic"

	"github.com/weirnet/weir/internal/k8s"
	"github.com/weirnet/weir/internal/policy"
)

const (
	// reportAckAfter is how long after this node programs a cluster
	// policy change its Node report says so: changes within it share a
	// report.
	reportAckAfter = time.Second
	// policyStatusRetry is how soon the elected writer looks again while
	// a policy is not programmed everywhere or an update failed.
	policyStatusRetry = 2 * time.Second
	// policyStatusGap is the least time between two rounds: every Node
	// report in the cluster asks for one.
	policyStatusGap = 500 * time.Millisecond
	// maxAckError bounds the error a Node report carries per policy.
	maxAckError = 1024
)

// clusterAcks is what a node that loaded a compilation of policies has
// programmed of each: its generation, and the compiler's errors for it
// (Result.Errors name a cluster policy as "Kind/name: ").
func clusterAcks(policies []*policy.ClusterPolicy, errs []error) map[string]k8s.PolicyAck {
	out := make(map[string]k8s.PolicyAck, len(policies))
	for _, p := range policies {
		out[p.Ref()] = k8s.PolicyAck{Generation: p.Generation}
	}
	for _, e := range errs {
		ref, msg, ok := strings.Cut(e.Error(), ": ")
		ack, found := out[ref]
		if !ok || !found {
			continue // a NetworkPolicy's
		}
		ack.Error = appendAckError(ack.Error, msg)
		out[ref] = ack
	}
	return out
}

// weirPolicyAcks is what a node that loaded a compilation has programmed
// of each WeirNetworkPolicy (the snapshot's policies with HTTP rules):
// its generation, and the compiler's errors for it, keyed
// WeirNetworkPolicy/namespace/name (k8s.ClusterPolicyObject.Ref).
func weirPolicyAcks(s *policy.Snapshot, errs []error) map[string]k8s.PolicyAck {
	out := map[string]k8s.PolicyAck{}
	for p := range s.HTTP {
		out[k8s.WeirPolicyRef(p.Namespace, p.Name)] = k8s.PolicyAck{Generation: p.Generation}
	}
	for _, e := range errs {
		var npe *policy.NetworkPolicyError
		if !errors.As(e, &npe) || npe.Kind != policy.KindWeirNetworkPolicy {
			continue
		}
		ref := k8s.WeirPolicyRef(npe.Namespace, npe.Name)
		ack, found := out[ref]
		if !found {
			continue
		}
		ack.Error = appendAckError(ack.Error, npe.Err.Error())
		out[ref] = ack
	}
	return out
}

// appendAckError adds msg to a policy's ack error, within maxAckError.
func appendAckError(have, msg string) string {
	if have != "" {
		have += "; "
	}
	have += msg
	if len(have) > maxAckError {
		have = strings.ToValidUTF8(have[:maxAckError-3], "") + "..."
	}
	return have
}

// ackPoliciesLocked records what the datapath now enforces of the
// cluster policies and WeirNetworkPolicies, once it has loaded them, and
// asks for a Node report when that changed.
func (a *Agent) ackPoliciesLocked(s *policy.Snapshot, errs []error) {
	acks := clusterAcks(s.ClusterPolicies, errs)
	maps.Copy(acks, weirPolicyAcks(s, errs))
	a.setAcksLocked(acks)
}

// setAcksLocked keeps acks and asks for a Node report when they changed.
func (a *Agent) setAcksLocked(acks map[string]k8s.PolicyAck) {
	if maps.Equal(acks, a.policy.acks) {
		return
	}
	a.policy.acks = acks
	select {
	case a.policy.acked <- struct{}{}:
	default: // a report is already asked for, or none is made (nil)
	}
}

// startPolicyStatus runs the cluster policies' status writer beside the
// agent until stop is called, which waits for it to end.
func (a *Agent) startPolicyStatus(ctx context.Context, w *k8s.Watcher, dyn dynamic.Interface) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.runPolicyStatus(ctx, w, dyn)
	}()
	return func() {
		cancel()
		<-done
	}
}

// runPolicyStatus keeps the cluster policies' conditions in step with the
// Node reports, when this node is the elected writer: after each change
// to a Node or a policy, and every policyStatusRetry while one is pending.
// It runs apart from the policy loop, which never waits for it.
func (a *Agent) runPolicyStatus(ctx context.Context, w *k8s.Watcher, dyn dynamic.Interface) {
	changes := w.PolicyStatusChanges()
	retry := time.NewTimer(policyStatusRetry)
	defer retry.Stop()
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return
		case <-changes:
		case <-retry.C:
		}
		if !w.Synced() {
			retry.Reset(policyStatusRetry)
		} else {
			r, err := k8s.SyncPolicyStatus(ctx, dyn, a.cfg.NodeName, w.Nodes(), w.ClusterPolicyObjects(), time.Now())
			switch {
			case err != nil && err.Error() != lastErr:
				a.log.Warn("update cluster policy status", "err", err)
			case err == nil && lastErr != "":
				a.log.Info("updating cluster policy status again")
			}
			lastErr = ""
			if err != nil {
				lastErr = err.Error()
			}
			if r.Written > 0 {
				a.log.Debug("cluster policy status updated", "policies", r.Written)
			}
			if r.Pending {
				retry.Reset(policyStatusRetry)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(policyStatusGap):
		}
	}
}

package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// policyEvents watches the benchmark's NetworkPolicies the way an agent
// does and records when each event arrived. A change's time to
// enforcement splits at that moment: before it, the API server and etcd
// (write, commit, fan-out to watchers); after it, the agent and the
// datapath. Without the split, a slow API server reads as a slow agent.
type policyEvents struct {
	mu   sync.Mutex
	seen map[string]time.Time // "ADDED/grant-3" → arrival
	cond *sync.Cond
	w    watch.Interface
	done chan struct{}
}

// watchPolicies starts the watch and returns once the API server accepted
// it, so no event of a later write can be missed.
func watchPolicies(ctx context.Context, c kubernetes.Interface, namespace string) (*policyEvents, error) {
	w, err := c.NetworkingV1().NetworkPolicies(namespace).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("watch NetworkPolicies in %s: %w", namespace, err)
	}
	e := &policyEvents{seen: map[string]time.Time{}, w: w, done: make(chan struct{})}
	e.cond = sync.NewCond(&e.mu)
	go e.record()
	return e, nil
}

func (e *policyEvents) record() {
	defer close(e.done)
	for ev := range e.w.ResultChan() {
		at := time.Now()
		p, ok := ev.Object.(*networkingv1.NetworkPolicy)
		if !ok {
			continue
		}
		e.mu.Lock()
		key := string(ev.Type) + "/" + p.Name
		if _, dup := e.seen[key]; !dup {
			e.seen[key] = at
		}
		e.mu.Unlock()
		e.cond.Broadcast()
	}
	e.mu.Lock()
	e.seen = nil // ended: waiters stop waiting
	e.mu.Unlock()
	e.cond.Broadcast()
}

// arrived waits up to limit for an event (watch.Added, watch.Deleted) of
// the named policy and returns when it arrived.
func (e *policyEvents) arrived(t watch.EventType, name string, limit time.Duration) (time.Time, error) {
	key := string(t) + "/" + name
	timer := time.AfterFunc(limit, e.cond.Broadcast)
	defer timer.Stop()
	deadline := time.Now().Add(limit)
	e.mu.Lock()
	defer e.mu.Unlock()
	for {
		if e.seen == nil {
			return time.Time{}, fmt.Errorf("the NetworkPolicy watch ended before %s %s arrived", t, name)
		}
		if at, ok := e.seen[key]; ok {
			return at, nil
		}
		if !time.Now().Before(deadline) {
			return time.Time{}, fmt.Errorf("no %s event for NetworkPolicy %s within %v", t, name, limit)
		}
		e.cond.Wait()
	}
}

func (e *policyEvents) close() {
	e.w.Stop()
	<-e.done
}

package datapath

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/policy"
)

// nodeL7 is what a node that reads requests (EnableL7) holds of the HTTP
// sets policy names: the kernel's tables and, for each set written, its
// compiled lookups (needed to delete it). A set is written under base
// plus the compiler's number (policy.HTTPSetID), which never names other
// rules in the compiler's life; base is above every set an earlier agent
// left in the pinned tables, whose compiler numbered from 1 too.
type nodeL7 struct {
	tables  l7Tables
	written map[policy.HTTPSetID]*l7.KernelRules
	base    uint32
	// key is the reader's hash key: sets are compiled under it.
	key l7.HashKey
	// stale: sets an earlier agent wrote (numbers up to base) may still
	// be in the tables, until the first full load replaced every entry
	// naming them (pruneHTTPSets).
	stale bool
	// matchers are the written sets' full matchers by kernel number,
	// for the user-space judge of handed connections (HTTPMatcher),
	// which reads them while policy is applied.
	mu       sync.RWMutex
	matchers map[uint32]*l7.Matcher
}

// HTTPMatcher is the full matcher (regular expressions included) of the
// HTTP set the kernel numbers set, for the proxy that judges handed
// connections; nil for a set this agent did not write (an earlier
// agent's, or none), whose requests are then denied.
func (n *Node) HTTPMatcher(set uint32) *l7.Matcher {
	if n.l7 == nil {
		return nil
	}
	n.l7.mu.RLock()
	defer n.l7.mu.RUnlock()
	return n.l7.matchers[set]
}

// EnableL7 makes the node enforce the HTTP rules policy restricts
// ingress allows to, with s's tables: from the next ApplyPolicy on, such
// an allow is written restricted to its set (tc records the connection,
// s's programs judge its requests) instead of closed. Call it before the
// first ApplyPolicy: entries written closed before stay closed until they
// change.
func (n *Node) EnableL7(s *L7Sockets) error {
	return n.enableL7(s.tables, s.objs.WeirL7Flows, s.key)
}

func (n *Node) enableL7(t l7Tables, flows *ebpf.Map, key l7.HashKey) error {
	base, err := highestHTTPSet(t, flows)
	if err != nil {
		return err
	}
	n.l7 = &nodeL7{tables: t, written: map[policy.HTTPSetID]*l7.KernelRules{}, base: base, stale: base > 0, key: key,
		matchers: map[uint32]*l7.Matcher{}}
	return nil
}

// highestHTTPSet is the highest set number the tables or a connection
// name.
func highestHTTPSet(t l7Tables, flows *ebpf.Map) (uint32, error) {
	var high, id uint32
	var row l7L7Set
	it := t.sets.Iterate()
	for it.Next(&id, &row) {
		high = max(high, id)
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("read HTTP sets: %w", err)
	}
	var k l7L7SockKey
	var f l7L7Flow
	fit := flows.Iterate()
	for fit.Next(&k, &f) {
		high = max(high, f.Sets[0]&^L7SetTiered, f.Sets[1]&^L7SetTiered, f.Sets[2]&^L7SetTiered)
	}
	if err := fit.Err(); err != nil {
		return 0, fmt.Errorf("read L7 flows: %w", err)
	}
	return high, nil
}

// kernelHTTPSet is the set an entry is written restricted to: its
// kernel number once written, 0 (the allow written closed) when the node
// does not read requests or the set could not be written. Both
// directions are read: an ingress entry's requests by the server's
// socket verdict, an egress entry's by the client's message verdict
// (bpf/lib/l7client.h).
func (n *Node) kernelHTTPSet(id policy.HTTPSetID) uint32 {
	if id == 0 || n.l7 == nil || n.l7.written[id] == nil {
		return 0
	}
	return n.l7.base + uint32(id)
}

// L7SetTiered marks a kernel set number whose rules include conditional
// cluster rules (bpf/lib/l7flow.h L7_SET_TIERED): a flow naming one has
// every request handed to user space, which judges it against the whole
// policy (policy.Result.LookupHTTP). The set itself is never written to
// the kernel's tables.
const L7SetTiered uint32 = 1 << 31

// TieredSets says whether a flow's sets send its requests to user space
// for the tier walk (L7SetTiered).
func TieredSets(sets [3]uint32) bool {
	return (sets[0]|sets[1]|sets[2])&L7SetTiered != 0
}

// tieredHTTPSet is the number an entry with conditional cluster rules is
// written with: its set's number, marked.
func (n *Node) tieredHTTPSet(id policy.HTTPSetID) uint32 {
	return L7SetTiered | (n.l7.base + uint32(id))
}

// writeHTTPSets writes the sets the diff adds, before the entries that
// name them. A set the kernel cannot hold (over 64 rules, once several
// policies' rules add up) is left unwritten: its entries are written
// closed, and the error says which.
func (n *Node) writeHTTPSets(d policy.Diff) error {
	if n.l7 == nil {
		return nil
	}
	var errs []error
	for id, rules := range d.HTTPSets {
		if n.l7.written[id] != nil {
			continue
		}
		k, err := l7.CompileKernel(rules, n.l7.key)
		var m *l7.Matcher
		if err == nil {
			m, err = l7.Compile(rules)
		}
		if err == nil {
			// The matcher first: a handed connection may meet the set
			// as soon as the kernel has it.
			n.l7.setMatcher(n.l7.base+uint32(id), m)
			err = n.l7.tables.writeSet(n.l7.base+uint32(id), k)
		}
		if err != nil {
			n.l7.setMatcher(n.l7.base+uint32(id), nil)
			errs = append(errs, fmt.Errorf("HTTP set %d (%d rules): %w: its allows stay closed: %w", id, len(rules), err, ErrPolicyClosed))
			continue
		}
		n.l7.written[id] = k
	}
	return errors.Join(errs...)
}

// deleteHTTPSets deletes the sets the diff drops, once no entry names
// them and flows were told to be judged again: a connection still naming
// one (its next packet not yet through tc) is denied meanwhile, never
// judged against other rules.
func (n *Node) deleteHTTPSets(d policy.Diff) error {
	if n.l7 == nil {
		return nil
	}
	var errs []error
	for _, id := range d.HTTPSetsGone {
		k := n.l7.written[id]
		if k == nil {
			continue
		}
		if err := n.l7.tables.deleteSet(n.l7.base+uint32(id), k); err != nil {
			errs = append(errs, err)
			continue
		}
		n.l7.setMatcher(n.l7.base+uint32(id), nil)
		delete(n.l7.written, id)
	}
	return errors.Join(errs...)
}

// pruneHTTPSets deletes the sets written that res does not name: those a
// failed apply wrote and the full rewrite after it no longer uses, and an
// earlier agent's, which no entry names once every entry was written.
func (n *Node) pruneHTTPSets(res *policy.Result) error {
	if n.l7 == nil {
		return nil
	}
	if n.l7.stale {
		if err := n.l7.tables.deleteUpTo(n.l7.base); err != nil {
			return err
		}
		n.l7.stale = false
	}
	var gone policy.Diff
	for id := range n.l7.written {
		if _, ok := res.HTTPSets[id]; !ok {
			gone.HTTPSetsGone = append(gone.HTTPSetsGone, id)
		}
	}
	return n.deleteHTTPSets(gone)
}

// setMatcher records (m nil: forgets) set's matcher.
func (l *nodeL7) setMatcher(set uint32, m *l7.Matcher) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if m == nil {
		delete(l.matchers, set)
		return
	}
	l.matchers[set] = m
}

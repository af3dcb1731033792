package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/weirnet/weir/internal/policy"
)

// VerdictCount is one counter of weir_verdicts (bpf/lib/events.h): the
// reported verdicts of one kind, summed over the CPUs. They are counted
// whether or not verdict events are on, so the metrics never go silent.
type VerdictCount struct {
	Rule, Log policy.RuleID // deciding and Log rules, 0: none
	// Ifindex is the endpoint, set only for a drop no rule decided.
	Ifindex   int
	Verdict   policy.Verdict
	Direction policy.Direction
	Stage     policy.Stage
	Count     uint64
}

func (c VerdictCount) key() lxcVerdictCountKey {
	return lxcVerdictCountKey{Rule: uint32(c.Rule), Log: uint32(c.Log), Ifindex: uint32(c.Ifindex),
		Verdict: uint8(c.Verdict), Dir: uint8(c.Direction), Stage: uint8(c.Stage)}
}

// VerdictCounts reads every verdict counter.
func (n *Node) VerdictCounts() ([]VerdictCount, error) {
	var (
		k      lxcVerdictCountKey
		perCPU []uint64
		out    []VerdictCount
	)
	it := n.progs.Verdicts.Iterate()
	for it.Next(&k, &perCPU) {
		c := VerdictCount{Rule: policy.RuleID(k.Rule), Log: policy.RuleID(k.Log), Ifindex: int(k.Ifindex),
			Verdict: policy.Verdict(k.Verdict), Direction: policy.Direction(k.Dir), Stage: policy.Stage(k.Stage)}
		for _, v := range perCPU {
			c.Count += v
		}
		out = append(out, c)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read verdict counters: %w", err)
	}
	return out, nil
}

// PruneVerdictCounts deletes the counters keep refuses: those of rules
// no longer loaded and of endpoints gone. Their series end; a rule
// number is never given to another rule (policy.Compiler), so a counter
// never passes from one rule to the next.
func (n *Node) PruneVerdictCounts(keep func(VerdictCount) bool) error {
	counts, err := n.VerdictCounts()
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range counts {
		if !keep(c) {
			if err := n.progs.Verdicts.Delete(c.key()); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("delete verdict counter: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

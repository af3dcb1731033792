package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
)

// The size pairs: after the Service counts, Weir's replacement alone is
// measured at the fewest and the most of them in turn, the count changed
// between the two halves of every pair. The levels run minutes apart and
// this machine's connection rates drift by tens of percent over a run,
// more than the 3% the size target asks about; a pair is measured within
// two minutes, its halves in alternating order (top-few, few-top, ...),
// so the drift is taken out of the ratio rather than carried into it.
const (
	// svSizePrefix starts the paths of the size pairs' samples.
	svSizePrefix = "size "
	// svSizeRounds: load runs of each path within one half of a pair,
	// each its own paired sample.
	svSizeRounds = 3
)

// sizePath is the path name of a size-pair sample.
func sizePath(path string) string { return svSizePrefix + path }

// measureSizePairs runs --size-pairs pairs between Service counts few and
// top, with the kernel's BPF run-time statistics on (for Weir alone, so
// they cost no peer anything) to show where a connection's time goes.
func (b *svBench) measureSizePairs(ctx context.Context, few, top int) error {
	if b.o.sizePairs == 0 || few == top {
		return nil
	}
	if err := b.switchTo(ctx, serviceProxies[0]); err != nil {
		return err
	}
	stats, err := datapath.EnableRunTimeStats()
	if err != nil {
		return err
	}
	defer stats.Close()
	fmt.Fprintf(b.out, "==> weir alone at %d and %d Services in turn, %d pairs\n", few, top, b.o.sizePairs)
	for pair := range b.o.sizePairs {
		order := []int{top, few}
		if pair%2 == 1 {
			order = []int{few, top}
		}
		for _, level := range order {
			if err := b.resize(ctx, level); err != nil {
				return err
			}
			if err := b.measureSize(ctx, level, pair); err != nil {
				return fmt.Errorf("size pair %d at %d Services: %w", pair+1, level, err)
			}
		}
	}
	return nil
}

// resize grows or shrinks the bulk Services to make level Services, and
// waits until every agent has programmed exactly those.
func (b *svBench) resize(ctx context.Context, level int) error {
	want := level - svSystemServices
	if want == b.bulk {
		return nil
	}
	start := time.Now()
	var err error
	if want > b.bulk {
		err = b.growTo(ctx, want)
	} else {
		err = b.shrinkTo(ctx, want)
	}
	if err != nil {
		return err
	}
	if err := b.waitBulkProgrammed(ctx, want); err != nil {
		return err
	}
	fmt.Fprintf(b.out, "    %d Services, programmed in %v\n", level, time.Since(start).Round(time.Second))
	return nil
}

// waitBulkProgrammed waits until every node's agent holds n bulk Service
// frontends and its maps match its table.
func (b *svBench) waitBulkProgrammed(ctx context.Context, n int) error {
	deadline := time.Now().Add(5 * time.Minute)
	for _, node := range b.st.Nodes {
		for {
			got, inSync, err := b.bulkFrontends(ctx, node.Client())
			if err == nil && got == n && inSync {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("node %s: %d bulk Service frontends programmed (in sync: %v, %v), want %d after 5 minutes", node.Name, got, inSync, err, n)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	return nil
}

// bulkFrontends counts an agent's frontends of bulk Services.
func (b *svBench) bulkFrontends(ctx context.Context, c *api.Client) (int, bool, error) {
	l, err := c.Services(ctx)
	if err != nil {
		return 0, false, err
	}
	n := 0
	for _, f := range l.Frontends {
		if strings.HasPrefix(f.Service, svNamespace+"/bulk-") {
			n++
		}
	}
	return n, l.InSync, nil
}

// measureSize runs svSizeRounds rounds of new-connection runs, intra and
// inter, through the ClusterIP and to the pod IP, and the eBPF programs'
// time per run over the ClusterIP runs. Which of the two goes first
// alternates by round: the first run of a half follows the resize most
// closely, so a fixed order would hand whatever the resize left running
// to one of them. Each run also records the agents' CPU time.
func (b *svBench) measureSize(ctx context.Context, level, pair int) error {
	setup := svSetup("weir", level)
	if err := b.waitQuiet(ctx, setup, pair); err != nil {
		return err
	}
	agents, _, err := b.proxyPIDs(false)
	if err != nil {
		return err
	}
	for round := range svSizeRounds {
		rep := pair*svSizeRounds + round
		for _, path := range []string{"intra", "inter"} {
			targets := []sizeTarget{
				{"", b.web.String() + ":80"},
				{" pod IP", net.JoinHostPort(b.server.IP.String(), strconv.Itoa(svHTTPPort))},
			}
			if (pair+round)%2 == 1 {
				targets[0], targets[1] = targets[1], targets[0]
			}
			for _, to := range targets {
				if err := b.measureSizeRun(ctx, setup, path, to, rep, agents); err != nil {
					return err
				}
			}
		}
	}
	fmt.Fprintf(b.out, "    pair %d, %s: intra %.0f conn/s (pod IP %.0f), connect program %.0f ns\n", pair+1, setup,
		b.last(setup, sizePath("intra"), "crr_per_s"), b.last(setup, sizePath("intra pod IP"), "crr_per_s"),
		b.last(setup, sizePath("intra"), "bpf_ns_per_run/sock4_connect"))
	return nil
}

// sizeTarget is where a size run connects: the ClusterIP ("") or the pod IP.
type sizeTarget struct{ suffix, host string }

// measureSizeRun is one new-connection run of a size pair.
func (b *svBench) measureSizeRun(ctx context.Context, setup, path string, to sizeTarget, rep int, agents []int) error {
	names := append(append([]string{}, datapath.SocketProgramNames...), datapath.ProgramNames...)
	before, err := datapath.ProgramStats(names)
	if err != nil {
		return err
	}
	usageBefore, err := readUsage(agents)
	if err != nil {
		return err
	}
	w, err := connRate(ctx, b.clients[path].NetNS, "http://"+to.host+"/", b.o.duration)
	if err != nil {
		return fmt.Errorf("new connections %s%s: %w", path, to.suffix, err)
	}
	usageAfter, err := readUsage(agents)
	if err != nil {
		return err
	}
	after, err := datapath.ProgramStats(names)
	if err != nil {
		return err
	}
	p := sizePath(path + to.suffix)
	b.add(setup, p, "crr_per_s", rep, w.rps)
	b.add(setup, p, "crr_errors", rep, float64(w.errors))
	secs := usageAfter.at.Sub(usageBefore.at).Seconds()
	b.add(setup, p, "agent_cpu_pct", rep, 100*float64(usageAfter.agentTicks-usageBefore.agentTicks)/clockTicks/secs)
	if to.suffix != "" {
		return nil
	}
	for _, name := range names {
		runs := after[name].RunCount - before[name].RunCount
		if runs < 100 {
			continue
		}
		ns := float64(after[name].RunTime-before[name].RunTime) / float64(runs)
		b.add(setup, p, "bpf_ns_per_run/"+name, rep, ns)
	}
	return nil
}

// Quiet machine: after a resize the control plane works on for a while
// (the endpoint controllers, etcd's compaction, the agents' syncs), more
// after growing to thousands of Services than after shrinking. A half
// starts once the machine has been under svQuietBusy busy for a
// svQuietWindow, or after svQuietMax regardless; the wait and the busy
// fraction it ended at are recorded beside the rates.
const (
	svQuietWindow = 3 * time.Second
	svQuietBusy   = 0.15
	svQuietMax    = 2 * time.Minute
)

func (b *svBench) waitQuiet(ctx context.Context, setup string, pair int) error {
	start := time.Now()
	var busy float64
	for {
		u0, err := readUsage(nil)
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(svQuietWindow):
		}
		u1, err := readUsage(nil)
		if err != nil {
			return err
		}
		busy = float64(u1.busy-u0.busy) / float64(max(1, u1.all-u0.all))
		if busy < svQuietBusy || time.Since(start) > svQuietMax {
			break
		}
	}
	b.add(setup, sizePath("quiet"), "wait_s", pair, time.Since(start).Seconds())
	b.add(setup, sizePath("quiet"), "machine_busy_pct", pair, 100*busy)
	return nil
}

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
// inter, through the ClusterIP and to the pod IP in turn, and the eBPF
// programs' time per run over the ClusterIP runs.
func (b *svBench) measureSize(ctx context.Context, level, pair int) error {
	setup := svSetup("weir", level)
	names := append(append([]string{}, datapath.SocketProgramNames...), datapath.ProgramNames...)
	for round := range svSizeRounds {
		rep := pair*svSizeRounds + round
		for _, path := range []string{"intra", "inter"} {
			client := b.clients[path].NetNS
			for _, to := range []struct{ suffix, host string }{
				{"", b.web.String() + ":80"},
				{" pod IP", net.JoinHostPort(b.server.IP.String(), strconv.Itoa(svHTTPPort))},
			} {
				before, err := datapath.ProgramStats(names)
				if err != nil {
					return err
				}
				w, err := connRate(ctx, client, "http://"+to.host+"/", b.o.duration)
				if err != nil {
					return fmt.Errorf("new connections %s%s: %w", path, to.suffix, err)
				}
				after, err := datapath.ProgramStats(names)
				if err != nil {
					return err
				}
				b.add(setup, sizePath(path+to.suffix), "crr_per_s", rep, w.rps)
				b.add(setup, sizePath(path+to.suffix), "crr_errors", rep, float64(w.errors))
				if to.suffix != "" {
					continue
				}
				for _, name := range names {
					runs := after[name].RunCount - before[name].RunCount
					if runs < 100 {
						continue
					}
					ns := float64(after[name].RunTime-before[name].RunTime) / float64(runs)
					b.add(setup, sizePath(path), "bpf_ns_per_run/"+name, rep, ns)
				}
			}
		}
	}
	fmt.Fprintf(b.out, "    pair %d, %s: intra %.0f conn/s (pod IP %.0f), connect program %.0f ns\n", pair+1, setup,
		b.last(setup, sizePath("intra"), "crr_per_s"), b.last(setup, sizePath("intra pod IP"), "crr_per_s"),
		b.last(setup, sizePath("intra"), "bpf_ns_per_run/sock4_connect"))
	return nil
}

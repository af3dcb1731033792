package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/lab"
)

// setup is one way of joining a client and a server namespace.
type setup struct {
	Name     string
	Path     string // intra (same node) or inter (across nodes)
	ClientNS string
	ServerNS string
	Dst      string
	Weir     bool // its eBPF programs are on the path
	// FlowsOff runs it with the lab's verdict events switched off, and
	// Lab is the Weir lab whose switch that is (nil: not a Weir setup).
	FlowsOff bool       `json:"-"`
	Lab      *lab.State `json:"-"`
}

// Names of the setups, as they appear in the results.
const (
	setupRaw         = "raw veth"
	setupWeir        = "weir"
	setupBridge      = "bridge"
	setupHost        = "host underlay"
	setupWeirVXLAN   = "weir vxlan"
	setupWeirNative  = "weir native"
	setupBridgeVXLAN = "bridge+vxlan"
	// The same Weir setups, same lab and pods, with the datapath's
	// verdict events switched off for the run: what flow records cost.
	setupWeirNoFlows      = "weir (flows off)"
	setupWeirVXLANNoFlows = "weir vxlan (flows off)"
)

// Lab names of the benchmark; Down removes each by name.
var benchLabs = []string{"wb-raw", "wb-v", "wb-n", "wb-b"}

func runDatapath(ctx context.Context, o options, out io.Writer) (retErr error) {
	if os.Geteuid() != 0 {
		return errors.New("the benchmark needs root (network namespaces, eBPF)")
	}
	started := time.Now()
	for _, name := range benchLabs {
		lab.Down(ctx, name, io.Discard) // leftovers of an interrupted run
	}
	defer func() {
		for _, name := range benchLabs {
			if err := lab.Down(context.Background(), name, io.Discard); err != nil {
				retErr = errors.Join(retErr, err)
			}
		}
	}()
	fmt.Fprintln(out, "==> building the topologies: raw veth pair, Weir (vxlan and native), bridge+host-local with VXLAN")
	raw, err := lab.UpVethPair("wb-raw", 1500)
	if err != nil {
		return err
	}
	labs := map[string]*lab.State{}
	for _, l := range []struct {
		name string
		mode datapath.Mode
		cni  string
	}{{"wb-v", datapath.ModeVXLAN, lab.CNIWeir}, {"wb-n", datapath.ModeNative, lab.CNIWeir}, {"wb-b", datapath.ModeVXLAN, lab.CNIBridge}} {
		st, err := lab.Up(ctx, lab.Config{Name: l.name, Nodes: 2, PodsPerNode: 2, Mode: l.mode, BinDir: o.binDir, CNI: l.cni}, io.Discard)
		if err != nil {
			return fmt.Errorf("lab %s: %w", l.name, err)
		}
		labs[l.name] = st
	}
	setups := []setup{
		{Name: setupRaw, Path: "intra", ClientNS: raw.NSA, ServerNS: raw.NSB, Dst: raw.AddrB.String()},
		podPair(labs["wb-v"], setupWeir, "intra", "n1-p1", "n1-p2", true),
		flowsOff(podPair(labs["wb-v"], setupWeirNoFlows, "intra", "n1-p1", "n1-p2", true)),
		podPair(labs["wb-b"], setupBridge, "intra", "n1-p1", "n1-p2", false),
		nodePair(labs["wb-v"], setupHost),
		podPair(labs["wb-v"], setupWeirVXLAN, "inter", "n1-p1", "n2-p1", true),
		flowsOff(podPair(labs["wb-v"], setupWeirVXLANNoFlows, "inter", "n1-p1", "n2-p1", true)),
		podPair(labs["wb-n"], setupWeirNative, "inter", "n1-p1", "n2-p1", true),
		podPair(labs["wb-b"], setupBridgeVXLAN, "inter", "n1-p1", "n2-p1", false),
	}

	res := &result{
		Scenario: "datapath",
		Command:  invocation,
		Commit:   sourceCommit(),
		Started:  started.UTC().Format(time.RFC3339),
		Machine:  machine(),
		Reps:     o.reps, DurationS: o.duration.Seconds(),
	}
	setups = selectSetups(setups, o.setups)
	if len(setups) == 0 {
		return fmt.Errorf("--setups %q names no setup", o.setups)
	}
	if err := measureTraffic(ctx, o, setups, res, out); err != nil {
		return err
	}
	if err := measureBPFCost(ctx, o, setups, res, out); err != nil {
		return err
	}
	if err := measureCNI(ctx, o, labs["wb-v"], labs["wb-b"], res, out); err != nil {
		return err
	}
	res.summarise()
	res.Finished = time.Now().UTC().Format(time.RFC3339)
	return res.write(o.out, out)
}

// datapathTests are the tests --tests keeps, in their fixed order.
func datapathTests(o options) []string {
	all := []string{"tcp_stream", "tcp_rr", "udp_stream", "tcp_crr"}
	if len(o.tests) == 0 {
		return all
	}
	var out []string
	for _, t := range all {
		if slices.Contains(o.tests, t) {
			out = append(out, t)
		}
	}
	return out
}

// selectSetups keeps the setups named (all when names is empty).
func selectSetups(setups []setup, names []string) []setup {
	if len(names) == 0 {
		return setups
	}
	var out []setup
	for _, s := range setups {
		if slices.Contains(names, s.Name) {
			out = append(out, s)
		}
	}
	return out
}

func podPair(st *lab.State, name, path, client, server string, weir bool) setup {
	c, _ := st.PodByName(client)
	s, _ := st.PodByName(server)
	out := setup{Name: name, Path: path, ClientNS: lab.PodNSPath(*c), ServerNS: lab.PodNSPath(*s), Dst: s.IP.String(), Weir: weir}
	if weir {
		out.Lab = st
	}
	return out
}

func flowsOff(s setup) setup {
	s.FlowsOff = true
	return s
}

// setFlowEvents switches the verdict events of every node of the setup's
// lab as the setup wants them (on unless FlowsOff).
func (s setup) setFlowEvents() error {
	if s.Lab == nil {
		return nil
	}
	for _, n := range s.Lab.Nodes {
		if err := datapath.SetPinnedFlowEvents(n.PinDir, !s.FlowsOff); err != nil {
			return fmt.Errorf("%s node %s: %w", s.Lab.Config.Name, n.Name, err)
		}
	}
	return nil
}

func nodePair(st *lab.State, name string) setup {
	return setup{Name: name, Path: "inter", ClientNS: lab.NodeNSPath(st.Nodes[0]), ServerNS: lab.NodeNSPath(st.Nodes[1]), Dst: st.Nodes[1].IP.String()}
}

// measureTraffic runs every test on every setup, rep by rep; within a rep
// the setups take turns in a rotating order so none always runs first. It
// repeats until the paired ratios are tight enough (precision.go).
func measureTraffic(ctx context.Context, o options, setups []setup, res *result, out io.Writer) error {
	tests := datapathTests(o)
	if o.warmup > 0 {
		fmt.Fprintf(out, "==> warm-up: every test on every setup for %v, discarded\n", o.warmup)
		warm, scratch := o, &result{}
		warm.duration = o.warmup
		for _, test := range tests {
			for _, s := range setups {
				if err := runOne(ctx, warm, s, test, 0, scratch, false); err != nil {
					return fmt.Errorf("warm-up %s %s (%s): %w", test, s.Name, s.Path, err)
				}
			}
		}
		res.WarmupS = o.warmup.Seconds()
	}
	for rep := 0; ; rep++ {
		for _, test := range tests {
			for i := range setups {
				s := setups[(i+rep)%len(setups)]
				if err := ctx.Err(); err != nil {
					return err
				}
				if err := runOne(ctx, o, s, test, rep, res, false); err != nil {
					return fmt.Errorf("%s %s (%s): %w", test, s.Name, s.Path, err)
				}
			}
			fmt.Fprintf(out, "    rep %d (at least %d, at most %d) %s done\n", rep+1, o.reps, max(o.reps, o.maxReps), test)
		}
		if enoughReps(o, res, rep+1, out) {
			return nil
		}
	}
}

// measureBPFCost reruns every test on the Weir setups with the kernel's
// BPF run-time statistics on, and records only the programs' cost: the
// statistics add two clock reads to every run, so the traffic figures
// above are measured with them off.
func measureBPFCost(ctx context.Context, o options, setups []setup, res *result, out io.Writer) error {
	stats, err := datapath.EnableRunTimeStats()
	if err != nil {
		return err
	}
	defer stats.Close()
	fmt.Fprintln(out, "==> eBPF cost per program run (kernel.bpf_stats_enabled)")
	for _, test := range datapathTests(o) {
		if test == "tcp_crr" {
			continue // its cost is the server's; the streams say what the programs cost
		}
		for _, s := range setups {
			if !s.Weir {
				continue
			}
			if err := runOne(ctx, o, s, test, 0, res, true); err != nil {
				return fmt.Errorf("%s %s (%s): %w", test, s.Name, s.Path, err)
			}
		}
	}
	return nil
}

// runOne runs one test on one setup. With costOnly it records the eBPF
// programs' run time per run instead of the traffic figures.
func runOne(ctx context.Context, o options, s setup, test string, rep int, res *result, costOnly bool) error {
	if err := s.setFlowEvents(); err != nil {
		return err
	}
	before, err := datapath.ProgramStats(datapath.ProgramNames)
	if err != nil {
		return err
	}
	add := func(metric string, v float64) {
		if !costOnly {
			res.Samples = append(res.Samples, sample{Setup: s.Name, Path: s.Path, Metric: metric, Rep: rep, Value: v})
		}
	}
	switch test {
	case "tcp_stream":
		gbps, err := tcpStream(ctx, s.ClientNS, s.ServerNS, s.Dst, o.duration)
		if err != nil {
			return err
		}
		add("tcp_gbps", gbps)
	case "tcp_rr":
		r, err := tcpRR(ctx, s.ClientNS, s.ServerNS, s.Dst, o.duration)
		if err != nil {
			return err
		}
		add("rr_avg_us", r.AvgUs)
		add("rr_p99_us", r.P99Us)
	case "udp_stream":
		gbps, loss, err := udpStream(ctx, s.ClientNS, s.ServerNS, s.Dst, o.duration)
		if err != nil {
			return err
		}
		add("udp_gbps", gbps)
		add("udp_loss_pct", loss)
	case "tcp_crr":
		cps, err := tcpCRR(ctx, s.ClientNS, s.ServerNS, s.Dst, o.duration)
		if err != nil {
			return err
		}
		add("crr_per_s", cps)
	}
	if !costOnly {
		return nil
	}
	after, err := datapath.ProgramStats(datapath.ProgramNames)
	if err != nil {
		return err
	}
	for _, name := range datapath.ProgramNames {
		runs := after[name].RunCount - before[name].RunCount
		if runs < 100 {
			continue
		}
		ns := float64(after[name].RunTime-before[name].RunTime) / float64(runs)
		res.Samples = append(res.Samples, sample{Setup: s.Name, Path: s.Path, Metric: "bpf_ns_per_run/" + test + "/" + name, Value: ns})
	}
	return nil
}

// measureCNI times CNI ADD and DEL for o.pods pods on node n1 of the Weir
// and the bridge lab, alternating pod by pod.
func measureCNI(ctx context.Context, o options, weir, bridge *lab.State, res *result, out io.Writer) error {
	fmt.Fprintf(out, "==> CNI ADD/DEL latency, %d pods each, Weir and bridge+host-local alternating\n", o.pods)
	for i := 0; i < o.pods; i++ {
		for _, l := range []struct {
			st   *lab.State
			name string
		}{{weir, setupWeir}, {bridge, setupBridge}} {
			p, err := l.st.AddPod(ctx, "n1", fmt.Sprintf("lat%d", i))
			if err != nil {
				return err
			}
			res.Samples = append(res.Samples, sample{Setup: l.name, Path: "cni", Metric: "add_ms", Rep: i, Value: ms(p.AddLatency)})
		}
	}
	for i := 0; i < o.pods; i++ {
		for _, l := range []struct {
			st   *lab.State
			name string
		}{{weir, setupWeir}, {bridge, setupBridge}} {
			d, err := l.st.DelPod(ctx, fmt.Sprintf("lat%d", i))
			if err != nil {
				return err
			}
			res.Samples = append(res.Samples, sample{Setup: l.name, Path: "cni", Metric: "del_ms", Rep: i, Value: ms(d)})
		}
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func machine() map[string]string {
	m := map[string]string{"cpus": fmt.Sprint(runtime.NumCPU()), "go": runtime.Version()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m["kernel"] = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				m["cpu"] = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	return m
}

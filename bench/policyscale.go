package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/lab"
)

// Names of the policy-scale run.
const (
	psLab       = "wb-ps"
	psRaw       = "wb-ps-raw"
	psNamespace = "bench"
	psServerApp = "server"
	psClientApp = "client"
	psLoadRole  = "load"
	psHTTPPort  = 8080
	// Ports: load tools use 20000+ (nextPort), which the one matching
	// rule allows; grants are timed on 30000+, level sentinels are 31000+,
	// and psDenyPort is never allowed by any level.
	psMatchFrom = 20000
	psMatchTo   = 29999
	psGrantBase = 30000
	psSentinel  = 31000
	psDenyPort  = 32000
	// rulesPerPolicy keeps every object far below etcd's size limit.
	rulesPerPolicy = 100
)

// psBench is one policy-scale run: a two-node Kubernetes lab, a server
// pod and two client pods (one per node), and an in-process echo server in
// the server pod's namespace for the probes that tell when a policy took
// effect.
type psBench struct {
	o         options
	st        *lab.State
	c         kubernetes.Interface
	res       *result
	out       io.Writer
	server    psPod
	clients   map[string]psPod // by path: intra, inter
	echo      *echoServer
	applied   int // level changes made, numbering sentinels
	agents    []int
	heartbeat *heartbeat // of the virtual nodes, once there are some
}

type psPod struct {
	Name, Node, NetNS string
	IP                net.IP
}

func (p psPod) addr(port int) string { return net.JoinHostPort(p.IP.String(), fmt.Sprint(port)) }

func runPolicyScale(ctx context.Context, o options, out io.Writer) (retErr error) {
	if os.Geteuid() != 0 {
		return errors.New("the benchmark needs root (network namespaces, eBPF, a Kubernetes lab)")
	}
	binDir, err := filepath.Abs(o.binDir)
	if err != nil {
		return err
	}
	lab.Down(ctx, psLab, io.Discard) // what an interrupted run left
	lab.Down(ctx, psRaw, io.Discard)
	res := &result{Scenario: "policy-scale", Command: invocation, Commit: sourceCommit(),
		Started: time.Now().UTC().Format(time.RFC3339), Machine: machine(), Reps: o.reps, DurationS: o.duration.Seconds()}
	raw, err := lab.UpVethPair(psRaw, 1500)
	if err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, lab.Down(context.Background(), psRaw, io.Discard)) }()
	fmt.Fprintln(out, "==> a two-node Kubernetes lab (agents as a DaemonSet, vxlan)")
	// kube-proxy as in the published runs (the lab's default then); the
	// probes go pod to pod, never through a Service.
	st, err := lab.Up(ctx, lab.Config{Name: psLab, Nodes: 2, Mode: datapath.ModeVXLAN, BinDir: binDir, Kubernetes: true,
		KubeProxy: lab.KubeProxyNFTables}, out)
	if err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, keepOrRemoveLab(o.keep, psLab, out)) }()
	b := &psBench{o: o, st: st, res: res, out: out, clients: map[string]psPod{}}
	if b.c, err = st.Client(); err != nil {
		return err
	}
	if err := b.setup(ctx); err != nil {
		return err
	}
	defer b.echo.close()

	rawSetup := setup{Name: setupRaw, Path: "intra", ClientNS: raw.NSA, ServerNS: raw.NSB, Dst: raw.AddrB.String()}
	if err := b.measureLevels(ctx, rawSetup); err != nil {
		return err
	}
	if err := b.measureClients(ctx); err != nil {
		return err
	}
	if err := b.measureChanges(ctx); err != nil {
		return err
	}
	res.summarise()
	res.Finished = time.Now().UTC().Format(time.RFC3339)
	return res.write(o.out, out)
}

// setup creates the namespace and the three pods and finds their network
// namespaces through the agents.
func (b *psBench) setup(ctx context.Context) error {
	if _, err := b.c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: psNamespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := waitServiceAccount(ctx, b.c, psNamespace); err != nil {
		return err
	}
	pods := []*corev1.Pod{
		benchPod("server", "n1", map[string]string{"app": psServerApp}, "netexec", fmt.Sprintf("--http-port=%d", psHTTPPort)),
		benchPod("client-intra", "n1", map[string]string{"app": psClientApp}, "pause"),
		benchPod("client-inter", "n2", map[string]string{"app": psClientApp}, "pause"),
	}
	ready, err := createPods(ctx, b.c, pods, 3*time.Minute)
	if err != nil {
		return err
	}
	if b.server, err = b.podNS(ctx, ready["server"]); err != nil {
		return err
	}
	for path, name := range map[string]string{"intra": "client-intra", "inter": "client-inter"} {
		if b.clients[path], err = b.podNS(ctx, ready[name]); err != nil {
			return err
		}
	}
	for _, n := range b.st.Nodes {
		pid, err := b.st.AgentPID(n.Name)
		if err != nil {
			return err
		}
		b.agents = append(b.agents, pid)
	}
	b.echo = newEchoServer(b.server.NetNS)
	return b.echo.listen(psDenyPort)
}

// benchPod is an agnhost pod pinned to a node.
func benchPod(name, node string, labels map[string]string, args ...string) *corev1.Pod {
	zero := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: psNamespace, Labels: labels},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": node},
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{
				Name: "main", Image: lab.AgnhostImage, ImagePullPolicy: corev1.PullNever, Args: args,
			}},
		},
	}
}

// podNS asks the pod's node agent for the namespace the runtime gave it.
func (b *psBench) podNS(ctx context.Context, p *corev1.Pod) (psPod, error) {
	return podNetNS(ctx, b.st, p)
}

// podNetNS asks the pod's node agent for the namespace the runtime gave
// it.
func podNetNS(ctx context.Context, st *lab.State, p *corev1.Pod) (psPod, error) {
	n, err := st.NodeByName(p.Spec.NodeName)
	if err != nil {
		return psPod{}, err
	}
	s, err := n.Client().Status(ctx)
	if err != nil {
		return psPod{}, err
	}
	for _, e := range s.Endpoints {
		if e.PodNamespace == p.Namespace && e.PodName == p.Name && e.NetNS != "" {
			return psPod{Name: p.Name, Node: p.Spec.NodeName, NetNS: e.NetNS, IP: net.ParseIP(p.Status.PodIP)}, nil
		}
	}
	return psPod{}, fmt.Errorf("agent of %s has no endpoint with a netns for %s/%s", p.Spec.NodeName, p.Namespace, p.Name)
}

// levelName is how a rule count appears in the results.
func levelName(rules int) string {
	if rules == 0 {
		return "no policy"
	}
	return fmt.Sprintf("%d rules", rules)
}

// measureLevels runs TCP stream, request/response and new connections,
// intra- and inter-node, at every rule count, rep by rep with the levels
// in a rotating order, and the raw veth pair in the same reps, until the
// paired ratios are tight enough (precision.go).
func (b *psBench) measureLevels(ctx context.Context, raw setup) error {
	levels := append([]int{0}, b.o.levels...)
	fmt.Fprintf(b.out, "==> TCP stream, request/response and new connections at %v rules, %d to %d reps\n", levels, b.o.reps, max(b.o.reps, b.o.maxReps))
	for rep := 0; ; rep++ {
		for i := range levels {
			rules := levels[(i+rep)%len(levels)]
			took, err := b.applyLevel(ctx, rules)
			if err != nil {
				return err
			}
			if rules > 0 {
				b.add(levelName(rules), "apply", "apply_s", rep, took.Seconds())
			}
			for _, path := range []string{"intra", "inter"} {
				s := setup{Name: levelName(rules), Path: path, ClientNS: b.clients[path].NetNS, ServerNS: b.server.NetNS, Dst: b.server.IP.String()}
				if err := b.traffic(ctx, s, rep); err != nil {
					return err
				}
			}
			fmt.Fprintf(b.out, "    rep %d, %s: applied in %v\n", rep+1, levelName(rules), took.Round(time.Millisecond))
		}
		if err := b.traffic(ctx, raw, rep); err != nil {
			return err
		}
		if enoughReps(b.o, b.res, rep+1, b.out) {
			return nil
		}
	}
}

// traffic runs a stream and a request/response test on one setup and
// records the agents' CPU and memory over the stream.
func (b *psBench) traffic(ctx context.Context, s setup, rep int) error {
	before, err := readUsage(b.agents)
	if err != nil {
		return err
	}
	gbps, err := tcpStream(ctx, s.ClientNS, s.ServerNS, s.Dst, b.o.duration)
	if err != nil {
		return fmt.Errorf("tcp stream %s (%s): %w", s.Name, s.Path, err)
	}
	after, err := readUsage(b.agents)
	if err != nil {
		return err
	}
	b.add(s.Name, s.Path, "tcp_gbps", rep, gbps)
	b.add(s.Name, s.Path, "cpu_busy_pct", rep, after.busyPct(before))
	if s.Name != setupRaw {
		b.add(s.Name, s.Path, "agent_cpu_pct", rep, after.agentPct(before))
		b.add(s.Name, s.Path, "agent_rss_mib", rep, after.rssMiB)
	}
	r, err := tcpRR(ctx, s.ClientNS, s.ServerNS, s.Dst, b.o.duration)
	if err != nil {
		return fmt.Errorf("tcp rr %s (%s): %w", s.Name, s.Path, err)
	}
	b.add(s.Name, s.Path, "rr_avg_us", rep, r.AvgUs)
	b.add(s.Name, s.Path, "rr_p99_us", rep, r.P99Us)
	// New connections: each one is looked up in the policy map, where a
	// single long connection is looked up once.
	cps, err := tcpCRR(ctx, s.ClientNS, s.ServerNS, s.Dst, b.o.duration)
	if err != nil {
		return fmt.Errorf("tcp crr %s (%s): %w", s.Name, s.Path, err)
	}
	b.add(s.Name, s.Path, "crr_per_s", rep, cps)
	return nil
}

func (b *psBench) add(setup, path, metric string, rep int, v float64) {
	b.res.Samples = append(b.res.Samples, sample{Setup: setup, Path: path, Metric: metric, Rep: rep, Value: v})
}

// applyLevel puts the server under rules non-matching rules plus the one
// that allows the load tools (none at all for 0), and returns how long the
// datapath took to enforce them from the first API write.
func (b *psBench) applyLevel(ctx context.Context, rules int) (time.Duration, error) {
	if rules == 0 {
		return b.replacePolicies(ctx, nil, 0)
	}
	b.applied++
	sentinel := psSentinel + b.applied
	return b.replacePolicies(ctx, levelPolicies(rules, b.applied, sentinel), sentinel)
}

// replacePolicies swaps the benchmark's policies for pols and returns when
// the datapath enforces them: a fresh sentinel port, allowed only by the
// last policy written, answers, and the never-allowed port does not. With
// no pols the never-allowed port must answer. New policies are written
// before old ones are deleted, so the server is never open in between.
func (b *psBench) replacePolicies(ctx context.Context, pols []*networkingv1.NetworkPolicy, sentinel int) (time.Duration, error) {
	api := b.c.NetworkingV1().NetworkPolicies(psNamespace)
	old, err := api.List(ctx, metav1.ListOptions{LabelSelector: "bench=policy-scale"})
	if err != nil {
		return 0, err
	}
	if len(pols) > 0 {
		if err := b.echo.listen(sentinel); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	for _, p := range pols {
		if _, err := api.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return 0, fmt.Errorf("create %s: %w", p.Name, err)
		}
	}
	for _, p := range old.Items {
		if err := api.Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			return 0, fmt.Errorf("delete %s: %w", p.Name, err)
		}
	}
	client := b.clients["inter"].NetNS
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		open := reachable(ctx, client, b.server.addr(psDenyPort), 100*time.Millisecond)
		if len(pols) == 0 && open {
			return time.Since(start), nil
		}
		if len(pols) > 0 && !open && reachable(ctx, client, b.server.addr(sentinel), 100*time.Millisecond) {
			return time.Since(start), nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, fmt.Errorf("%d policies not enforced after 3 minutes", len(pols))
}

// levelPolicies are rules ingress rules that do not match the benchmark's
// flows, in policies of rulesPerPolicy, plus one rule that does (the load
// tools' port range from the client pods) and, last, the sentinel rule.
// Half the non-matching rules name the clients on port ranges nobody
// uses, so the clients' own identity carries thousands of entries; half
// name /32s of 172.16.0.0/12 on port 80, each a CIDR identity of its own.
func levelPolicies(rules, generation, sentinel int) []*networkingv1.NetworkPolicy {
	if rules == 0 {
		return nil
	}
	tcp := corev1.ProtocolTCP
	port := func(p, end int) networkingv1.NetworkPolicyPort {
		pp := networkingv1.NetworkPolicyPort{Protocol: &tcp, Port: ptr(intstr.FromInt32(int32(p)))}
		if end > p {
			pp.EndPort = ptr(int32(end))
		}
		return pp
	}
	fromClients := []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": psClientApp}}}}
	var all []networkingv1.NetworkPolicyIngressRule
	for i := 0; i < rules; i++ {
		if i%2 == 0 {
			lo := 40000 + (i/2)*2%20000
			all = append(all, networkingv1.NetworkPolicyIngressRule{From: fromClients, Ports: []networkingv1.NetworkPolicyPort{port(lo, lo+i%3)}})
			continue
		}
		cidr := fmt.Sprintf("172.%d.%d.%d/32", 16+(i>>16)&15, (i>>8)&255, i&255)
		all = append(all, networkingv1.NetworkPolicyIngressRule{
			From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: cidr}}},
			Ports: []networkingv1.NetworkPolicyPort{port(80, 0)},
		})
	}
	all = append(all,
		networkingv1.NetworkPolicyIngressRule{From: fromClients, Ports: []networkingv1.NetworkPolicyPort{port(psMatchFrom, psMatchTo)}},
		networkingv1.NetworkPolicyIngressRule{From: fromClients, Ports: []networkingv1.NetworkPolicyPort{port(sentinel, 0)}},
	)
	var out []*networkingv1.NetworkPolicy
	for i := 0; i < len(all); i += rulesPerPolicy {
		end := min(i+rulesPerPolicy, len(all))
		out = append(out, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{
				Name:   fmt.Sprintf("scale-g%d-%05d", generation, i/rulesPerPolicy),
				Labels: map[string]string{"bench": "policy-scale"},
			},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": psServerApp}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress:     all[i:end],
			},
		})
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// keepOrRemoveLab removes a benchmark's Kubernetes lab when the run ends,
// or, with --keep, says how to reach it and remove it later.
func keepOrRemoveLab(keep bool, name string, out io.Writer) error {
	if keep {
		fmt.Fprintf(out, "lab %s kept: WEIR_LAB=%s weir lab kubectl ...; remove it with `WEIR_LAB=%s weir lab down`\n", name, name, name)
		return nil
	}
	return lab.Down(context.Background(), name, io.Discard)
}

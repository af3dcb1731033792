package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/weirnet/weir/internal/lab"
)

// Setups of the concurrent-clients measurement.
const (
	clientsOpen   = "no policy"
	clientsPolicy = "one policy"
)

// measureClients runs 50, 100 and 200 client pods on n2 at once against
// the server's HTTP port on n1 (study 000, Fig. 13), each client a wrk
// with one connection, with no policy and under one policy that admits
// them, the two alternating within every rep.
func (b *psBench) measureClients(ctx context.Context) error {
	most := 0
	for _, n := range b.o.clients {
		most = max(most, n)
	}
	if most == 0 {
		return nil
	}
	fmt.Fprintf(b.out, "==> %d client pods on n2\n", most)
	var pods []*corev1.Pod
	for i := 0; i < most; i++ {
		pods = append(pods, benchPod(fmt.Sprintf("load-%03d", i), "n2", map[string]string{"role": psLoadRole}, "pause"))
	}
	ready, err := createPods(ctx, b.c, pods, 15*time.Minute)
	if err != nil {
		return err
	}
	st, err := b.st.Nodes[1].Client().Status(ctx)
	if err != nil {
		return err
	}
	netns := map[string]string{}
	for _, e := range st.Endpoints {
		netns[e.PodName] = e.NetNS
	}
	var clients []string
	for i := 0; i < most; i++ {
		ns := netns[fmt.Sprintf("load-%03d", i)]
		if ns == "" || ready[fmt.Sprintf("load-%03d", i)] == nil {
			return fmt.Errorf("client pod load-%03d has no network namespace on n2", i)
		}
		clients = append(clients, ns)
	}
	url := fmt.Sprintf("http://%s/hostname", b.server.addr(psHTTPPort))
	for rep := 0; rep < b.o.reps; rep++ {
		for i := range b.o.clients {
			n := b.o.clients[(i+rep)%len(b.o.clients)]
			setups := []string{clientsOpen, clientsPolicy}
			if rep%2 == 1 {
				setups[0], setups[1] = setups[1], setups[0]
			}
			for _, s := range setups {
				if err := b.applyClientsPolicy(ctx, s == clientsPolicy); err != nil {
					return err
				}
				r := runClients(ctx, clients[:n], url, b.o.clientDuration)
				path := fmt.Sprintf("%d clients", n)
				b.add(s, path, "completed", rep, float64(r.completed))
				b.add(s, path, "rps_total", rep, r.rps)
				b.add(s, path, "latency_avg_ms", rep, r.latencyMs)
				fmt.Fprintf(b.out, "    rep %d/%d, %d clients, %s: %d completed, %.0f requests/s, %.2f ms mean\n",
					rep+1, b.o.reps, n, s, r.completed, r.rps, r.latencyMs)
			}
		}
	}
	return nil
}

// applyClientsPolicy removes every policy, or puts the server under one
// that admits the load pods on the HTTP port (and the probe's sentinel).
func (b *psBench) applyClientsPolicy(ctx context.Context, on bool) error {
	if !on {
		_, err := b.replacePolicies(ctx, nil, 0)
		return err
	}
	b.applied++
	sentinel := psSentinel + b.applied
	tcp := corev1.ProtocolTCP
	p := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("load-g%d", b.applied), Labels: map[string]string{"bench": "policy-scale"}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": psServerApp}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{
				{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": psLoadRole}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptr(intstr.FromInt32(psHTTPPort))}},
				},
				{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": psClientApp}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptr(intstr.FromInt32(int32(sentinel)))}},
				},
			},
		},
	}
	_, err := b.replacePolicies(ctx, []*networkingv1.NetworkPolicy{p}, sentinel)
	return err
}

// clientsResult sums one concurrent run.
type clientsResult struct {
	completed int
	rps       float64 // sum over clients
	latencyMs float64 // mean of the clients' mean latencies
}

var (
	wrkRequests = regexp.MustCompile(`(\d+) requests in`)
	wrkRPS      = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	wrkLatency  = regexp.MustCompile(`Latency\s+([0-9.]+)(us|ms|s)\b`)
	wrkErrors   = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
	wrkNon2xx   = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
)

// runClients starts one wrk per client namespace at once and waits for
// all. A client completed when wrk ran its whole time with at least one
// request, no socket error and no failed response.
func runClients(ctx context.Context, clients []string, url string, d time.Duration) clientsResult {
	var mu sync.Mutex
	var r clientsResult
	var latSum float64
	var wg sync.WaitGroup
	for _, ns := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := exec.CommandContext(ctx, "nsenter", "--net="+ns, "--", "wrk", "-t1", "-c1",
				"-d"+strconv.Itoa(int(d.Seconds()))+"s", "--timeout", "5s", url).CombinedOutput()
			w, ok := parseWrk(out)
			mu.Lock()
			defer mu.Unlock()
			r.rps += w.rps
			if err == nil && ok {
				r.completed++
				latSum += w.latencyMs
			}
		}()
	}
	wg.Wait()
	if r.completed > 0 {
		r.latencyMs = latSum / float64(r.completed)
	}
	return r
}

type wrkResult struct {
	requests  int
	rps       float64
	latencyMs float64
}

// parseWrk reads wrk's summary; ok means the run had requests and no
// errors.
func parseWrk(out []byte) (wrkResult, bool) {
	var w wrkResult
	if m := wrkRequests.FindSubmatch(out); m != nil {
		w.requests, _ = strconv.Atoi(string(m[1]))
	}
	if m := wrkRPS.FindSubmatch(out); m != nil {
		w.rps, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	if m := wrkLatency.FindSubmatch(out); m != nil {
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		w.latencyMs = v * map[string]float64{"us": 0.001, "ms": 1, "s": 1000}[string(m[2])]
	}
	ok := w.requests > 0
	if m := wrkErrors.FindSubmatch(out); m != nil {
		for _, e := range m[1:] {
			if n, _ := strconv.Atoi(string(e)); n > 0 {
				ok = false
			}
		}
	}
	if wrkNon2xx.Match(out) {
		ok = false
	}
	return w, ok
}

// measureChanges fills the cluster to --total-pods pods, applies 1,000
// rules, records the agents' memory, then times --samples policy changes
// from the API write to the datapath: a new policy granting a client a
// port (until a connection to it succeeds) and its deletion (until a
// live connection on it stops answering).
func (b *psBench) measureChanges(ctx context.Context) error {
	defer b.heartbeat.stop()
	if err := b.fillCluster(ctx, b.o.totalPods); err != nil {
		return err
	}
	const rules = 1000
	if _, err := b.applyLevel(ctx, rules); err != nil {
		return err
	}
	setupName := fmt.Sprintf("%d pods, %d rules", b.o.totalPods, rules)
	time.Sleep(5 * time.Second) // let the agents settle after the burst of pods
	u, err := readUsage(b.agents)
	if err != nil {
		return err
	}
	b.add(setupName, "agents", "agent_rss_mib", 0, u.rssMiB)
	fmt.Fprintf(b.out, "==> %d policy changes at %s (largest agent RSS %.1f MiB)\n", b.o.samples, setupName, u.rssMiB)
	pols := b.c.NetworkingV1().NetworkPolicies(psNamespace)
	events, err := watchPolicies(ctx, b.c, psNamespace)
	if err != nil {
		return err
	}
	defer events.close()
	for k := 0; k < b.o.samples; k++ {
		path := []string{"intra", "inter"}[k%2]
		port := psGrantBase + k
		if err := b.echo.listen(port); err != nil {
			return err
		}
		p := grantPolicy(k, port)
		stall, err := cpuStall()
		if err != nil {
			return err
		}
		start := time.Now()
		if _, err := pols.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return err
		}
		conn, at, err := firstReachable(ctx, b.clients[path].NetNS, b.server.addr(port), time.Millisecond, 10*time.Second)
		if err != nil {
			return fmt.Errorf("grant %d: %w", k, err)
		}
		if stall, err = b.addChange(events, setupName, path, "grant", watch.Added, p.Name, k, start, at, stall); err != nil {
			conn.Close()
			return err
		}
		start = time.Now()
		if err := pols.Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			conn.Close()
			return err
		}
		at, err = lastEcho(conn, time.Millisecond, 20*time.Millisecond, 10*time.Second)
		conn.Close()
		if err != nil {
			return fmt.Errorf("revoke %d: %w", k, err)
		}
		if _, err := b.addChange(events, setupName, path, "revoke", watch.Deleted, p.Name, k, start, at, stall); err != nil {
			return err
		}
	}
	u, err = readUsage(b.agents)
	if err != nil {
		return err
	}
	b.add(setupName, "agents", "agent_rss_mib", 1, u.rssMiB)
	return nil
}

// slowChange is the time to enforcement past which a change is logged
// with its wall-clock time, to be found in the agents' logs.
const slowChange = 100 * time.Millisecond

// addChange records a change's time to enforcement, the API server's
// share of it (from the write until a watch of the benchmark's own saw
// the event) and the CPU pressure meanwhile (the share of the time some
// task waited for a CPU; stall is the reading at the write). It returns
// the pressure reading at its end, the next change's start.
func (b *psBench) addChange(events *policyEvents, setup, path, change string, t watch.EventType, name string, k int, start, enforced time.Time, stall time.Duration) (time.Duration, error) {
	delivered, err := events.arrived(t, name, 10*time.Second)
	if err != nil {
		return 0, fmt.Errorf("%s %d: %w", change, k, err)
	}
	now, err := cpuStall()
	if err != nil {
		return 0, err
	}
	pressure := 100 * float64(now-stall) / float64(time.Since(start))
	took := enforced.Sub(start)
	b.add(setup, path, change+"_ms", k, ms(took))
	b.add(setup, path, change+"_api_ms", k, ms(delivered.Sub(start)))
	b.add(setup, path, change+"_cpu_pressure_pct", k, pressure)
	if took > slowChange {
		fmt.Fprintf(b.out, "    slow %s %d (%s): %v to enforcement, the watch saw it after %v, CPU pressure %.0f%%; written at %s\n",
			change, k, path, took.Round(time.Millisecond), delivered.Sub(start).Round(time.Millisecond), pressure, start.UTC().Format("15:04:05.000"))
	}
	return now, nil
}

// grantPolicy admits the client pods on one port of the server.
func grantPolicy(k, port int) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("grant-%d", k)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": psServerApp}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": psClientApp}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptr(intstr.FromInt32(int32(port)))}},
			}},
		},
	}
}

// fillCluster adds pods until the cluster holds total. The two lab nodes
// cannot run that many (a /24 each), so the rest are bound to kubelet-less
// virtual nodes (the KWOK technique), kept Ready by a heartbeat of their
// Leases: real Pod and Node objects with an address each, which every agent must watch, give identities, place in
// its ipcache and match against selectors, as it would pods of a larger
// cluster. They carry 350 distinct label sets.
func (b *psBench) fillCluster(ctx context.Context, total int) error {
	have, err := b.c.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	need := total - len(have.Items)
	if need <= 0 {
		return nil
	}
	fmt.Fprintf(b.out, "==> %d pods on virtual nodes, for %d in the cluster\n", need, total)
	const ns = "virtual"
	if _, err := b.c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	var nodes []virtualNode
	for i := 0; i*virtualPodsPerNode < need; i++ {
		n, err := addVirtualNode(ctx, b.c, fmt.Sprintf("virt-%d", i+1), netip.AddrFrom4([4]byte{10, 99, 0, byte(230 + i)}))
		if err != nil {
			return err
		}
		nodes = append(nodes, n)
	}
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.name
	}
	if b.heartbeat, err = startHeartbeat(ctx, b.c, names, b.out); err != nil {
		return err
	}
	work := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				n := nodes[i/virtualPodsPerNode]
				if err := addVirtualPod(ctx, b.c, ns, i, n); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var sendErr error
	for i := 0; i < need && sendErr == nil; i++ {
		select {
		case work <- i:
		case sendErr = <-errs:
		}
	}
	close(work)
	wg.Wait()
	close(errs)
	return errors.Join(sendErr, <-errs)
}

// virtualPodsPerNode fills a virtual node's /24 from .2 on.
const virtualPodsPerNode = 250

type virtualNode struct {
	name string
	ip   netip.Addr
	cidr netip.Prefix
}

// addVirtualNode registers a Node no kubelet runs: tainted so nothing is
// scheduled there, Ready, with an address and the pod CIDR the controller
// manager gives it.
func addVirtualNode(ctx context.Context, c kubernetes.Interface, name string, ip netip.Addr) (virtualNode, error) {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"weir.io/virtual": "true"}},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: "weir.io/virtual", Effect: corev1.TaintEffectNoSchedule}}},
	}
	if _, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		return virtualNode{}, fmt.Errorf("virtual node %s: %w", name, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		got, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return virtualNode{}, err
		}
		if got.Spec.PodCIDR != "" {
			cidr, err := netip.ParsePrefix(got.Spec.PodCIDR)
			if err != nil {
				return virtualNode{}, err
			}
			// Controllers write the new Node too; retry on their updates.
			err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				got, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				got.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip.String()}}
				got.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
					Reason: "Virtual", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
				_, err = c.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{})
				return err
			})
			if err != nil {
				return virtualNode{}, fmt.Errorf("virtual node %s status: %w", name, err)
			}
			return virtualNode{name: name, ip: ip, cidr: cidr}, nil
		}
		if time.Now().After(deadline) {
			return virtualNode{}, fmt.Errorf("virtual node %s got no pod CIDR in a minute", name)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// addVirtualPod binds pod i to its virtual node and reports it running
// with an address of the node's /24, as a kubelet would.
func addVirtualPod(ctx context.Context, c kubernetes.Interface, ns string, i int, n virtualNode) error {
	a := n.cidr.Addr().As4()
	a[3] += byte(2 + i%virtualPodsPerNode)
	ip := netip.AddrFrom4(a)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("v-%04d", i), Labels: map[string]string{
			"app": fmt.Sprintf("virt-%d", i%50), "shard": fmt.Sprintf("s%d", i%7)}},
		Spec: corev1.PodSpec{
			NodeName:    n.name,
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:  []corev1.Container{{Name: "main", Image: lab.PauseImage}},
		},
	}
	got, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("virtual pod %s: %w", p.Name, err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		now := metav1.Now()
		got.Status = corev1.PodStatus{
			Phase: corev1.PodRunning, HostIP: n.ip.String(), PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}},
			StartTime:  &now,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}},
		}
		_, err := c.CoreV1().Pods(ns).UpdateStatus(ctx, got, metav1.UpdateOptions{})
		if err != nil {
			if fresh, gerr := c.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{}); gerr == nil {
				got = fresh
			}
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("virtual pod %s status: %w", p.Name, err)
	}
	return nil
}

// podReady says whether p is Ready and has its address.
func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue && p.Status.PodIP != "" {
			return true
		}
	}
	return false
}

// createPods creates pods and waits until every one is Ready, returning
// them by name as last seen.
func createPods(ctx context.Context, c kubernetes.Interface, pods []*corev1.Pod, timeout time.Duration) (map[string]*corev1.Pod, error) {
	for _, p := range pods {
		if _, err := c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("create pod %s: %w", p.Name, err)
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		ready := map[string]*corev1.Pod{}
		list, err := c.CoreV1().Pods(pods[0].Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		for i := range list.Items {
			if p := &list.Items[i]; podReady(p) {
				ready[p.Name] = p
			}
		}
		missing := 0
		for _, p := range pods {
			if ready[p.Name] == nil {
				missing++
			}
		}
		if missing == 0 {
			return ready, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d pods not Ready after %v", missing, len(pods), timeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

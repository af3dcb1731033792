package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/lab"
)

// Names and ports of the services run.
const (
	svLab       = "wb-svc"
	svNamespace = "bench"
	svServerApp = "svc-server"
	// The server pod listens on these through the benchmark's own
	// servers (started in its namespace); the Service maps 80 and 81 to
	// them and NodePort svNodePort to svHTTPPort.
	svHTTPPort = 8081
	svRRPort   = 8082
	svNodePort = 30080
	// svBulkLabel marks the Services made only to be counted.
	svBulkLabel = "bench-bulk"
	// Every bulk Service has two endpoints at addresses of the cluster
	// CIDR that no node hands out (10.244.128.0/17): kube-proxy and Weir
	// program them like any other, and no traffic goes there.
	svBulkEndpoints = 2
	// svSystemServices are the Services every level counts besides the
	// bulk ones: default/kubernetes, kube-system/kube-dns and the
	// benchmark's own.
	svSystemServices = 3
)

// serviceProxy is one setup of the run: who answers Services.
type serviceProxy struct {
	Name    string // as the results name it
	LabMode string // lab.SetServiceProxy's mode
	// KubeProxy: kube-proxy answers Services, Weir's agents leave them.
	KubeProxy bool
}

var serviceProxies = []serviceProxy{
	{Name: "weir", LabMode: lab.KubeProxyNone},
	{Name: "kube-proxy nftables", LabMode: lab.KubeProxyNFTables, KubeProxy: true},
	{Name: "kube-proxy iptables", LabMode: lab.KubeProxyIPTables, KubeProxy: true},
}

// svBench is one services run: a two-node lab with agents as host
// processes (so the Service proxy can be switched), a server pod on n1
// served by the benchmark's own servers, and client pods on n1 and n2.
type svBench struct {
	o       options
	st      *lab.State
	c       kubernetes.Interface
	res     *result
	out     io.Writer
	server  psPod
	clients map[string]psPod // intra, inter
	web     netip.Addr       // the benchmark Service's ClusterIP
	dns     netip.Addr       // kube-dns's ClusterIP
	bulk    int              // bulk Services made so far
	current string           // the lab's Service proxy now
	servers []*server
	changes int // Services made to time a change, numbering them
}

func runServices(ctx context.Context, o options, out io.Writer) (retErr error) {
	if os.Geteuid() != 0 {
		return errors.New("the benchmark needs root (network namespaces, eBPF, a Kubernetes lab)")
	}
	if err := checkLevels(o.levels); err != nil {
		return err
	}
	binDir, err := filepath.Abs(o.binDir)
	if err != nil {
		return err
	}
	lab.Down(ctx, svLab, io.Discard) // what an interrupted run left
	res := &result{Scenario: "services", Command: invocation, Commit: sourceCommit(),
		Started: time.Now().UTC().Format(time.RFC3339), Machine: machine(), Reps: o.reps, DurationS: o.duration.Seconds()}
	fmt.Fprintln(out, "==> a two-node Kubernetes lab (agents as host processes, vxlan, no kube-proxy to start with)")
	st, err := lab.Up(ctx, lab.Config{Name: svLab, Nodes: 2, Mode: datapath.ModeVXLAN, BinDir: binDir, Kubernetes: true,
		AgentMode: lab.AgentHost, KubeProxy: lab.KubeProxyNone}, out)
	if err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, keepOrRemoveLab(o.keep, svLab, out)) }()
	b := &svBench{o: o, st: st, res: res, out: out, clients: map[string]psPod{}, current: serviceProxies[0].Name}
	if b.c, err = fastClient(st); err != nil {
		return err
	}
	defer b.stopServers()
	if err := b.setup(ctx); err != nil {
		return err
	}
	var runErr error
	for _, level := range o.levels {
		if runErr = b.measureLevel(ctx, level); runErr != nil {
			// What was measured is kept, marked incomplete.
			res.Incomplete = runErr.Error()
			break
		}
	}
	if runErr == nil {
		if runErr = b.measureSizePairs(ctx, o.levels[0], o.levels[len(o.levels)-1]); runErr != nil {
			res.Incomplete = runErr.Error()
		}
	}
	res.summarise()
	res.Finished = time.Now().UTC().Format(time.RFC3339)
	return errors.Join(runErr, res.write(o.out, out))
}

// checkLevels wants Service counts that grow and leave room for the
// system's own Services.
func checkLevels(levels []int) error {
	if len(levels) == 0 {
		return errors.New("--services: want at least one Service count, such as 4,100,1000,5000")
	}
	for i, n := range levels {
		if n <= svSystemServices {
			return fmt.Errorf("--services %d: want more than %d (the cluster's own Services and the benchmark's)", n, svSystemServices)
		}
		if i > 0 && n <= levels[i-1] {
			return fmt.Errorf("--services %v: want counts in increasing order (Services are added, never removed)", levels)
		}
	}
	return nil
}

// fastClient is a client that may create thousands of objects quickly.
func fastClient(st *lab.State) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", st.Kube.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 500, 1000
	return kubernetes.NewForConfig(cfg)
}

// setup creates the pods, the benchmark Service and the servers.
func (b *svBench) setup(ctx context.Context) error {
	if _, err := b.c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: svNamespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := waitServiceAccount(ctx, b.c, svNamespace); err != nil {
		return err
	}
	ready, err := createPods(ctx, b.c, []*corev1.Pod{
		benchPod("server", "n1", map[string]string{"app": svServerApp}, "pause"),
		benchPod("client-intra", "n1", nil, "pause"),
		benchPod("client-inter", "n2", nil, "pause"),
	}, 3*time.Minute)
	if err != nil {
		return err
	}
	if b.server, err = podNetNS(ctx, b.st, ready["server"]); err != nil {
		return err
	}
	for path, name := range map[string]string{"intra": "client-intra", "inter": "client-inter"} {
		if b.clients[path], err = podNetNS(ctx, b.st, ready[name]); err != nil {
			return err
		}
	}
	for _, nsPath := range []string{b.clients["intra"].NetNS, b.clients["inter"].NetNS, nsFile(b.st.ExtHost)} {
		if err := tuneLoadClient(ctx, nsPath); err != nil {
			return err
		}
	}
	if err := b.startServers(ctx); err != nil {
		return err
	}
	web, err := b.c.CoreV1().Services(svNamespace).Create(ctx, webService("web", svNodePort), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create the benchmark Service: %w", err)
	}
	b.web = netip.MustParseAddr(web.Spec.ClusterIP)
	dns, err := b.c.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("find kube-dns: %w", err)
	}
	b.dns = netip.MustParseAddr(dns.Spec.ClusterIP)
	return b.waitServing(ctx)
}

// startServers runs the HTTP server (CPU 1, as the connection-rate
// test's) and the sockperf server (CPU 0, beside its client, as the
// request/response test's) in the server pod for the whole run.
func (b *svBench) startServers(ctx context.Context) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the bench binary to serve HTTP: %w", err)
	}
	for _, args := range [][]string{
		{serverCPU, self, "http-server", "--port", strconv.Itoa(svHTTPPort), "--client-closes"},
		{rrCPU, "sockperf", "server", "--tcp", "-i", "0.0.0.0", "-p", strconv.Itoa(svRRPort)},
	} {
		s, err := startServer(ctx, b.server.NetNS, args[0], args[1:]...)
		if err != nil {
			return err
		}
		b.servers = append(b.servers, s)
	}
	return nil
}

func (b *svBench) stopServers() {
	for _, s := range b.servers {
		s.stop()
	}
}

// webService is a NodePort Service for the server pod: port 80 to its HTTP
// server, 81 to its sockperf server; nodePort 0 lets the API pick.
func webService(name string, nodePort int32) *corev1.Service {
	typ := corev1.ServiceTypeClusterIP
	if nodePort != 0 {
		typ = corev1.ServiceTypeNodePort
	}
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: svNamespace},
		Spec: corev1.ServiceSpec{
			Type:     typ,
			Selector: map[string]string{"app": svServerApp},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, TargetPort: intstr.FromInt32(svHTTPPort), NodePort: nodePort, Protocol: corev1.ProtocolTCP},
				{Name: "rr", Port: 81, TargetPort: intstr.FromInt32(svRRPort), Protocol: corev1.ProtocolTCP},
			},
		},
	}
}

// waitServing waits until the benchmark Service answers from both
// clients and from outside, and a DNS lookup succeeds: the Service proxy
// in place has everything programmed.
func (b *svBench) waitServing(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	targets := map[string]string{
		b.clients["intra"].NetNS: net.JoinHostPort(b.web.String(), "80"),
		b.clients["inter"].NetNS: net.JoinHostPort(b.web.String(), "81"),
		nsFile(b.st.ExtHost):     b.nodePortAddr(),
	}
	for ns, addr := range targets {
		for !reachable(ctx, ns, addr, 200*time.Millisecond) {
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: %s not reachable from %s after 2 minutes", b.current, addr, ns)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for {
		_, err := dnsLookupOnce(ctx, b.clients["inter"].NetNS, netip.AddrPortFrom(b.dns, 53), webFQDN)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no DNS answer from %v after 2 minutes: %w", b.current, b.dns, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// nodePortAddr is the NodePort at n2, the node without the backend: the
// request is forwarded to n1.
func (b *svBench) nodePortAddr() string {
	n2, _ := b.st.NodeByName("n2")
	return net.JoinHostPort(n2.IP.String(), strconv.Itoa(svNodePort))
}

func nsFile(name string) string { return filepath.Join("/var/run/netns", name) }

// measureLevel grows the cluster to level Services, then runs every
// repetition with the Service proxies in a rotating order.
func (b *svBench) measureLevel(ctx context.Context, level int) error {
	start := time.Now()
	if err := b.growTo(ctx, level-svSystemServices); err != nil {
		return err
	}
	fmt.Fprintf(b.out, "==> %d Services (made in %v)\n", level, time.Since(start).Round(time.Second))
	for rep := 0; rep < b.o.reps; rep++ {
		for i := range serviceProxies {
			p := serviceProxies[(i+rep)%len(serviceProxies)]
			if err := b.switchTo(ctx, p); err != nil {
				return err
			}
			if err := b.measure(ctx, p, level, rep); err != nil {
				return fmt.Errorf("%s at %d Services: %w", p.Name, level, err)
			}
		}
	}
	return nil
}

// switchTo puts the lab's Service proxy in place and waits until it
// serves.
func (b *svBench) switchTo(ctx context.Context, p serviceProxy) error {
	if b.current == p.Name {
		return nil
	}
	start := time.Now()
	if err := b.st.SetServiceProxy(ctx, p.LabMode); err != nil {
		return err
	}
	b.current = p.Name
	if err := b.waitServing(ctx); err != nil {
		return err
	}
	fmt.Fprintf(b.out, "    switched to %s in %v\n", p.Name, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// growTo creates bulk Services (each with its EndpointSlice) until there
// are n, sixteen creations at a time.
func (b *svBench) growTo(ctx context.Context, n int) error {
	if err := b.forEachBulk(ctx, b.bulk, n, b.createBulk); err != nil {
		return err
	}
	b.bulk = max(b.bulk, n)
	return nil
}

// shrinkTo deletes the newest bulk Services and their EndpointSlices
// until n are left, sixteen deletions at a time.
func (b *svBench) shrinkTo(ctx context.Context, n int) error {
	if err := b.forEachBulk(ctx, n, b.bulk, b.deleteBulk); err != nil {
		return err
	}
	b.bulk = min(b.bulk, n)
	return nil
}

// forEachBulk runs fn for the bulk Service numbers from to to-1 on
// sixteen workers, stopping at the first error.
func (b *svBench) forEachBulk(ctx context.Context, from, to int, fn func(context.Context, int) error) error {
	todo := make(chan int)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range todo {
				if err := fn(ctx, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
loop:
	for i := from; i < to; i++ {
		select {
		case todo <- i:
		case err = <-errs:
			break loop
		}
	}
	close(todo)
	wg.Wait()
	close(errs)
	if err == nil {
		err = <-errs
	}
	return err
}

// createBulk makes bulk Service i: a ClusterIP Service without a selector
// and its EndpointSlice, as a controller would write it.
func (b *svBench) createBulk(ctx context.Context, i int) error {
	name := bulkName(i)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: svNamespace, Labels: map[string]string{svBulkLabel: "true"}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}
	if _, err := b.c.CoreV1().Services(svNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Service %s: %w", name, err)
	}
	ready, port, proto := true, int32(8080), corev1.ProtocolTCP
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: svNamespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "bench.weir.dev", svBulkLabel: "true"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: &port, Protocol: &proto}},
	}
	for k := range svBulkEndpoints {
		j := i*svBulkEndpoints + k
		addr := fmt.Sprintf("10.244.%d.%d", 128+j/250, 1+j%250)
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	if _, err := b.c.DiscoveryV1().EndpointSlices(svNamespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create EndpointSlice %s: %w", name, err)
	}
	return nil
}

// deleteBulk deletes bulk Service i and its EndpointSlice.
func (b *svBench) deleteBulk(ctx context.Context, i int) error {
	name := bulkName(i)
	if err := b.c.CoreV1().Services(svNamespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete Service %s: %w", name, err)
	}
	if err := b.c.DiscoveryV1().EndpointSlices(svNamespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete EndpointSlice %s: %w", name, err)
	}
	return nil
}

func bulkName(i int) string { return fmt.Sprintf("bulk-%05d", i) }

// proxyPIDs are the processes whose CPU and memory a Service proxy costs:
// the agents, and kube-proxy where it runs.
func (b *svBench) proxyPIDs(kubeProxy bool) (agents, proxies []int, err error) {
	for _, n := range b.st.Nodes {
		pid, err := b.st.AgentPID(n.Name)
		if err != nil {
			return nil, nil, err
		}
		agents = append(agents, pid)
	}
	if !kubeProxy {
		return agents, nil, nil
	}
	for _, p := range b.st.Servers() {
		if filepath.Base(p.Name) == "kube-proxy" && p.Alive() {
			proxies = append(proxies, p.PID)
		}
	}
	if len(proxies) != len(b.st.Nodes) {
		return nil, nil, fmt.Errorf("%d kube-proxy processes run, want one per node", len(proxies))
	}
	return agents, proxies, nil
}

// tuneLoadClient gives a load generator's namespace what load generators
// are given: every port above 1023 to connect from, and TIME_WAIT sockets
// older than a second reused for new connections. Without it, thousands of
// connections a second to one server address (the backend behind both the
// ClusterIP, once Weir translated it at the socket, and the pod IP) leave
// its ports in TIME_WAIT, and connect() spends milliseconds looking for a
// free one, or finds none: the client's limit, measured as the proxy's.
func tuneLoadClient(ctx context.Context, nsPath string) error {
	out, err := exec.CommandContext(ctx, "nsenter", "--net="+nsPath, "--", "sysctl", "-q", "-w",
		"net.ipv4.ip_local_port_range=1024 65535", "net.ipv4.tcp_tw_reuse=1").CombinedOutput()
	if err != nil {
		return fmt.Errorf("tune the load client in %s: %w: %s", nsPath, err, out)
	}
	return nil
}

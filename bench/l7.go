package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/k8s/apis/weirv1alpha1"
	"github.com/weirnet/weir/internal/l7"
	"github.com/weirnet/weir/internal/lab"
)

// The l7 scenario is issue 20's benchmark on the lab: one server
// Deployment on n1 (nginx, one worker, in the pod's network namespace),
// a client pod beside it (wrk and fortio's periodic runner in its
// namespace), and the API-aware filtering study's five configurations
// applied through the API server in turn: no policy, an L3 rule, an L4
// rule, one L7 rule and 40 (WeirNetworkPolicy). The peer is what a
// proxy-based CNI does: nginx as a proxy pod on the server's node, in
// the server's path, enforcing the same HTTP rules (a map of regular
// expressions, 403 for the rest) over keep-alive upstream connections.
const (
	l7Lab       = "wb-l7lab"
	l7ServerApp = "l7-server"
	l7ClientApp = "l7-client"
	// l7Port is the server's port with the rules; l7OtherPort another
	// port of it, which the L4 and L7 rules leave out.
	l7Port      = 8080
	l7OtherPort = 8081
	// The proxy pod's ports: one enforcing 1 rule, one 40.
	l7PeerPort1  = 8080
	l7PeerPort40 = 8081
	l7MaxPath    = "max rate"
	l7RatePath   = "constant rate"
	l7CostPath   = "ebpf cost"
)

// l7Programs are the eBPF programs a request to the server can run: the
// pods' tc programs, and the socket programs of bpf/l7.c (the HTTP
// reader's receive verdict, the server's send verdict that reads its
// answers, the proxy's write-back, the join at the handshake).
var l7Programs = []string{"from_container", "to_container", "l7_http_verdict", "l7_server_msg", "l7_proxy_msg", "l7_sockops"}

// The configurations, in report order.
const (
	l7NoPolicy  = "no policy"
	l7L3        = "L3 rule"
	l7L4        = "L4 rule"
	l7One       = "L7, 1 rule"
	l7Forty     = "L7, 40 rules"
	l7PeerOne   = "nginx proxy, 1 rule"
	l7PeerForty = "nginx proxy, 40 rules"
	// One rule with a Host header's regular expression, which the kernel
	// leaves to user space: every connection handed to the node's proxy
	// at its first request.
	l7HeaderRegex = "L7, 1 header regex rule (user space)"
	// A WeirClusterNetworkPolicy's Admin Accept of GET / with an HTTP
	// rule before a Deny of the rest: judged by the node's proxy against
	// the precedence order.
	l7Tiers = "L7, cluster-tier rule (user space)"
)

// How a configuration's requests are judged at the server's node.
const (
	judgedNone   = iota // no HTTP rules: nothing reads the requests
	judgedKernel        // read and allowed in the kernel
	judgedProxy         // handed to the agent's proxy at the first request
)

// Issue 20's target against the proxy-based peer.
const l7WantPeer = 1.3

// l7Config is one configuration: the policy the API server holds while
// it runs, where the client sends, and what a probe must see once it is
// in place (so a figure is never of a configuration not yet enforced).
type l7Config struct {
	name string
	// policy is the manifest (JSON or YAML) applied; nil: no policy.
	policy func() ([]byte, error)
	peer   int // the proxy's port the client sends to; 0: the server
	judged int // judgedNone, judgedKernel or judgedProxy
	// Once in place: POST / is answered 403; a pod the rules do not name
	// connects to the server's l7Port; the client connects to
	// l7OtherPort.
	post403, outsider, otherPort bool
}

var l7Configs = []l7Config{
	{name: l7NoPolicy, outsider: true, otherPort: true},
	{name: l7L3, policy: manifest(func() (any, error) { return l7NetworkPolicy(false), nil }), otherPort: true},
	{name: l7L4, policy: manifest(func() (any, error) { return l7NetworkPolicy(true), nil })},
	{name: l7One, policy: manifest(func() (any, error) { return l7HTTPPolicy(l7GateRules(1)) }), judged: judgedKernel, post403: true},
	{name: l7Forty, policy: manifest(func() (any, error) { return l7HTTPPolicy(l7GateRules(40)) }), judged: judgedKernel, post403: true},
	{name: l7HeaderRegex, policy: manifest(func() (any, error) { return l7HTTPPolicy(l7GateHeaderRegexRules()) }), judged: judgedProxy, post403: true},
	{name: l7Tiers, policy: func() ([]byte, error) { return []byte(l7TierPolicy), nil }, judged: judgedProxy, post403: true, otherPort: true},
	{name: l7PeerOne, peer: l7PeerPort1, post403: true, outsider: true, otherPort: true},
	{name: l7PeerForty, peer: l7PeerPort40, post403: true, outsider: true, otherPort: true},
}

// manifest is obj as JSON, which kubectl applies.
func manifest(obj func() (any, error)) func() ([]byte, error) {
	return func() ([]byte, error) {
		o, err := obj()
		if err != nil {
			return nil, err
		}
		return json.Marshal(o)
	}
}

// l7TierPolicy is the cluster-tier configuration: an Admin Accept of
// GET / (every path) from the client pods with an HTTP rule, then a Deny
// of every other request and peer on the port: one HTTP rule, as the
// other one-rule configurations have.
const l7TierPolicy = `apiVersion: weir.io/v1alpha1
kind: WeirClusterNetworkPolicy
metadata: {name: bench-l7}
spec:
  tier: Admin
  priority: 10
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: l7-server}}}}
  ingress:
  - name: get
    action: Accept
    from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: l7-client}}}}]
    protocols: [{tcp: {destinationPort: {number: 8080}}}]
    http: [{method: GET, path: {type: PathPrefix, value: /}}]
  - name: rest
    action: Deny
    from: [{namespaces: {}}]
    protocols: [{tcp: {destinationPort: {number: 8080}}}]
`

// l7Bench is one run's lab, pods and servers.
type l7Bench struct {
	o                               options
	st                              *lab.State
	c                               kubernetes.Interface
	res                             *result
	out                             io.Writer
	server, client, outsider, proxy psPod
	servers                         []*nginxServer
	current                         string // the configuration in place
}

func runL7(ctx context.Context, o options, out io.Writer) (retErr error) {
	if os.Geteuid() != 0 {
		return errors.New("the benchmark needs root (network namespaces, eBPF, a Kubernetes lab)")
	}
	binDir, err := filepath.Abs(o.binDir)
	if err != nil {
		return err
	}
	lab.Down(ctx, l7Lab, io.Discard) // what an interrupted run left
	res := &result{Scenario: "l7", Command: invocation, Commit: sourceCommit(), Started: time.Now().UTC().Format(time.RFC3339),
		Machine: machine(), Reps: o.reps, DurationS: o.duration.Seconds(), WarmupS: o.warmup.Seconds()}
	fmt.Fprintln(out, "==> a two-node Kubernetes lab (agents as a DaemonSet, vxlan)")
	st, err := lab.Up(ctx, lab.Config{Name: l7Lab, Nodes: 2, Mode: datapath.ModeVXLAN, BinDir: binDir, Kubernetes: true,
		KubeProxy: lab.KubeProxyNFTables}, out)
	if err != nil {
		return err
	}
	defer func() { retErr = errors.Join(retErr, keepOrRemoveLab(o.keep, l7Lab, out)) }()
	b := &l7Bench{o: o, st: st, res: res, out: out, current: l7NoPolicy}
	if b.c, err = st.Client(); err != nil {
		return err
	}
	defer b.stopServers()
	if err := b.setup(ctx); err != nil {
		return err
	}
	err = b.measure(ctx)
	if err == nil {
		err = b.measureCost(ctx)
	}
	if err != nil {
		res.Incomplete = err.Error() // what was measured is kept
	}
	res.summarise()
	res.Finished = time.Now().UTC().Format(time.RFC3339)
	return errors.Join(err, res.write(o.out, out))
}

// setup creates the server Deployment, the client, a pod no rule names
// and the proxy pod, all on n1, and starts nginx in the server's and the
// proxy's namespaces, both pinned to the server's CPU: a per-node proxy
// shares the server node's CPUs.
func (b *l7Bench) setup(ctx context.Context) error {
	if _, err := b.c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: psNamespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := waitServiceAccount(ctx, b.c, psNamespace); err != nil {
		return err
	}
	if _, err := b.c.AppsV1().Deployments(psNamespace).Create(ctx, l7ServerDeployment(), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the server Deployment: %w", err)
	}
	ready, err := createPods(ctx, b.c, []*corev1.Pod{
		benchPod("client", "n1", map[string]string{"app": l7ClientApp}, "pause"),
		benchPod("outsider", "n1", map[string]string{"app": "l7-outsider"}, "pause"),
		benchPod("proxy", "n1", map[string]string{"app": "l7-proxy"}, "pause"),
	}, 3*time.Minute)
	if err != nil {
		return err
	}
	serverPod, err := deploymentPod(ctx, b.c, l7ServerApp, time.Minute)
	if err != nil {
		return err
	}
	for dst, p := range map[*psPod]*corev1.Pod{&b.server: serverPod, &b.client: ready["client"], &b.outsider: ready["outsider"], &b.proxy: ready["proxy"]} {
		if *dst, err = podNetNS(ctx, b.st, p); err != nil {
			return err
		}
	}
	if err := tuneLoadClient(ctx, b.client.NetNS); err != nil {
		return err
	}
	srv, err := startNginx(ctx, b.server.NetNS, "", b.server.IP.String(), []int{l7Port, l7OtherPort}, nil)
	if err != nil {
		return err
	}
	b.servers = append(b.servers, srv)
	conf, err := l7PeerConfig(b.proxy.IP.String(), b.server.addr(l7Port))
	if err != nil {
		return err
	}
	px, err := runNginx(ctx, b.proxy.NetNS, "", serverCPU, conf, []string{b.proxy.addr(l7PeerPort1), b.proxy.addr(l7PeerPort40)})
	if err != nil {
		return fmt.Errorf("the proxy peer: %w", err)
	}
	b.servers = append(b.servers, px)
	return b.waitInPlace(ctx, l7Configs[0])
}

func (b *l7Bench) stopServers() {
	for _, s := range b.servers {
		s.stop()
	}
}

// l7ServerDeployment is the server: one replica on n1, a pause container
// whose network namespace the benchmark's nginx serves in.
func l7ServerDeployment() *appsv1.Deployment {
	labels := map[string]string{"app": l7ServerApp}
	pod := benchPod("", "n1", labels, "pause")
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "server", Namespace: psNamespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: pod.Spec},
		},
	}
}

// deploymentPod waits for the one Ready pod labelled app.
func deploymentPod(ctx context.Context, c kubernetes.Interface, app string, timeout time.Duration) (*corev1.Pod, error) {
	deadline := time.Now().Add(timeout)
	for {
		list, err := c.CoreV1().Pods(psNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			return nil, err
		}
		for i := range list.Items {
			if p := &list.Items[i]; podReady(p) && p.DeletionTimestamp == nil {
				return p, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no Ready pod of app=%s after %v", app, timeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// l7NetworkPolicy is the L3 rule (the client pods may connect to the
// server) or, withPort, the L4 rule (to its l7Port only).
func l7NetworkPolicy(withPort bool) *networkingv1.NetworkPolicy {
	rule := networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{
		PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": l7ClientApp}}}}}
	if withPort {
		tcp, port := corev1.ProtocolTCP, intstr.FromInt32(l7Port)
		rule.Ports = []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}
	}
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: "bench-l7", Namespace: psNamespace},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": l7ServerApp}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{rule},
		},
	}
}

// l7HTTPPolicy is the L7 rules: the client pods may send to the server's
// l7Port the requests rules match.
func l7HTTPPolicy(rules []l7.Rule) (*weirv1alpha1.WeirNetworkPolicy, error) {
	var http []weirv1alpha1.HTTPRule
	for _, r := range rules {
		h, err := l7APIRule(r)
		if err != nil {
			return nil, err
		}
		http = append(http, h)
	}
	tcp, port := corev1.ProtocolTCP, intstr.FromInt32(l7Port)
	return &weirv1alpha1.WeirNetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: weirv1alpha1.SchemeGroupVersion.String(), Kind: "WeirNetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: "bench-l7", Namespace: psNamespace},
		Spec: weirv1alpha1.WeirNetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": l7ServerApp}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []weirv1alpha1.WeirNetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": l7ClientApp}}}},
				Ports: []weirv1alpha1.WeirNetworkPolicyPort{{NetworkPolicyPort: networkingv1.NetworkPolicyPort{Protocol: &tcp, Port: &port}, HTTP: http}},
			}},
		},
	}, nil
}

// l7APIRule is rule as the policy API writes it.
func l7APIRule(r l7.Rule) (weirv1alpha1.HTTPRule, error) {
	var h weirv1alpha1.HTTPRule
	for _, m := range r.Headers {
		hm := weirv1alpha1.HTTPHeaderMatch{Type: ptr(weirv1alpha1.HTTPHeaderMatchType(m.Type)), Name: gatewayv1.HTTPHeaderName(m.Name)}
		if m.Type != l7.HeaderPresent {
			hm.Value = ptr(m.Value)
		}
		h.Headers = append(h.Headers, hm)
	}
	if r.Method != "" {
		h.Method = ptr(gatewayv1.HTTPMethod(r.Method))
	}
	if r.Path != nil {
		h.Path = &weirv1alpha1.HTTPPathMatch{Type: ptr(gatewayv1.PathMatchType(r.Path.Type)), Value: ptr(r.Path.Value)}
	}
	for _, n := range r.Hostnames {
		h.Hostnames = append(h.Hostnames, gatewayv1.Hostname(n))
	}
	return h, nil
}

// switchTo puts c's policy in place through the API server (the previous
// configuration's deleted first) and waits until the node enforces it.
func (b *l7Bench) switchTo(ctx context.Context, c l7Config) error {
	if b.current == c.name {
		return nil
	}
	start := time.Now()
	for _, args := range [][]string{{"-n", psNamespace, "networkpolicies.networking.k8s.io,weirnetworkpolicies.weir.io"}, {"weirclusternetworkpolicies.weir.io"}} {
		if out, err := b.st.Kubectl(ctx, nil, append(append([]string{"delete"}, args...), "--all", "--wait=true")...); err != nil {
			return fmt.Errorf("delete the previous configuration's policy: %w: %s", err, out)
		}
	}
	b.current = ""
	if c.policy != nil {
		doc, err := c.policy()
		if err != nil {
			return err
		}
		if out, err := b.st.Kubectl(ctx, bytes.NewReader(doc), "apply", "-f", "-"); err != nil {
			return fmt.Errorf("%s: apply its policy: %w: %s", c.name, err, out)
		}
	}
	if err := b.waitInPlace(ctx, c); err != nil {
		return err
	}
	b.current = c.name
	fmt.Fprintf(b.out, "    %s in place in %v\n", c.name, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// waitInPlace waits until every probe of c sees what c wants: GET / is
// served, POST / denied or served, the outsider and the other port
// reachable or not.
func (b *l7Bench) waitInPlace(ctx context.Context, c l7Config) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := b.probe(ctx, c)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not in place after a minute: %w", c.name, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (b *l7Bench) probe(ctx context.Context, c l7Config) error {
	target := b.target(c)
	want := map[bool]int{true: http.StatusForbidden, false: http.StatusOK}
	for _, p := range []struct {
		method string
		status int
	}{{"GET", http.StatusOK}, {"POST", want[c.post403]}} {
		got, err := httpStatusIn(ctx, b.client.NetNS, target, p.method)
		if err != nil {
			return fmt.Errorf("%s / to %s: %w", p.method, target, err)
		}
		if got != p.status {
			return fmt.Errorf("%s / to %s: %d, want %d", p.method, target, got, p.status)
		}
	}
	if got := reachable(ctx, b.outsider.NetNS, b.server.addr(l7Port), 300*time.Millisecond); got != c.outsider {
		return fmt.Errorf("a pod no rule names reaches %s: %v, want %v", b.server.addr(l7Port), got, c.outsider)
	}
	if got := reachable(ctx, b.client.NetNS, b.server.addr(l7OtherPort), 300*time.Millisecond); got != c.otherPort {
		return fmt.Errorf("the client reaches %s: %v, want %v", b.server.addr(l7OtherPort), got, c.otherPort)
	}
	return nil
}

// target is where c's client sends: the server or the proxy.
func (b *l7Bench) target(c l7Config) string {
	if c.peer != 0 {
		return b.proxy.addr(c.peer)
	}
	return b.server.addr(l7Port)
}

// httpStatusIn sends one request with method to / at addr from the
// namespace at nsPath, on a connection of its own, and returns the
// answer's status.
func httpStatusIn(ctx context.Context, nsPath, addr, method string) (int, error) {
	conn, err := dialIn(ctx, nsPath, addr, 500*time.Millisecond)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintf(conn, "%s / HTTP/1.1\r\nHost: %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", method, addr); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// measure runs the warm-up, then every repetition: each configuration
// at the most requests/s wrk gets at 100 connections, then each at a
// constant rate of half no policy's most in the same repetition, the
// configurations in a rotating order in both passes.
func (b *l7Bench) measure(ctx context.Context) error {
	if b.o.warmup > 0 {
		fmt.Fprintf(b.out, "==> warm-up: %s of each configuration, discarded\n", b.o.warmup)
		for _, c := range l7Configs {
			if err := b.switchTo(ctx, c); err != nil {
				return err
			}
			if _, err := wrkKeepAlive(ctx, b.client.NetNS, "http://"+b.target(c)+"/", b.o.warmup, ""); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
		}
	}
	for rep := 0; rep < b.o.reps; rep++ {
		for i := range l7Configs {
			c := l7Configs[(rep+i)%len(l7Configs)]
			if err := b.maxRate(ctx, c, rep); err != nil {
				return err
			}
		}
		most := b.res.sampleValue(l7NoPolicy, l7MaxPath, "rps", rep)
		if !(most > 0) {
			return fmt.Errorf("repetition %d: no requests/s of %q", rep+1, l7NoPolicy)
		}
		for i := range l7Configs {
			// The other way round: the first is the one in place.
			c := l7Configs[(rep+len(l7Configs)-1-i)%len(l7Configs)]
			if err := b.constantRate(ctx, c, rep, most/2); err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *l7Bench) maxRate(ctx context.Context, c l7Config, rep int) error {
	if err := b.switchTo(ctx, c); err != nil {
		return err
	}
	before, err := b.kernelCounters(ctx)
	if err != nil {
		return err
	}
	w, err := wrkKeepAlive(ctx, b.client.NetNS, "http://"+b.target(c)+"/", b.o.duration, "")
	if err != nil {
		return fmt.Errorf("%s: %w", c.name, err)
	}
	judged, err := b.checkJudged(ctx, c, before, w.rps*b.o.duration.Seconds())
	if err != nil {
		return err
	}
	// Still in place after the load: the figure is the configuration's.
	if err := b.probe(ctx, c); err != nil {
		return fmt.Errorf("%s after its run: %w", c.name, err)
	}
	for metric, v := range map[string]float64{"rps": w.rps, "p50_ms": w.p50, "p99_ms": w.p99, "errors": w.errors, judgedMetric(c): judged} {
		b.res.Samples = append(b.res.Samples, sample{Setup: c.name, Path: l7MaxPath, Metric: metric, Rep: rep, Value: v})
	}
	fmt.Fprintf(b.out, "rep %d %-22s %8.0f req/s  p50 %.3f ms  p99 %.3f ms  errors %v\n", rep+1, c.name, w.rps, w.p50, w.p99, w.errors)
	return nil
}

func (b *l7Bench) constantRate(ctx context.Context, c l7Config, rep int, rate float64) error {
	if err := b.switchTo(ctx, c); err != nil {
		return err
	}
	before, err := b.kernelCounters(ctx)
	if err != nil {
		return err
	}
	r, err := httpRate(ctx, b.client.NetNS, httpRateOptions{URL: "http://" + b.target(c) + "/", Method: "GET", QPS: rate, Conns: l7GateConns, D: b.o.duration})
	if err != nil {
		return fmt.Errorf("%s at %.0f req/s: %w", c.name, rate, err)
	}
	judged, err := b.checkJudged(ctx, c, before, float64(r.Codes[http.StatusOK]))
	if err != nil {
		return err
	}
	failed := float64(r.N - r.Codes[http.StatusOK]) // N counts the calls without an answer too
	for metric, v := range map[string]float64{"rate_asked": rate, "rate_got": r.ActualQPS, "p50_ms": r.P50Ms, "p90_ms": r.P90Ms,
		"p99_ms": r.P99Ms, "p999_ms": r.P999Ms, "errors": failed, judgedMetric(c): judged} {
		b.res.Samples = append(b.res.Samples, sample{Setup: c.name, Path: l7RatePath, Metric: metric, Rep: rep, Value: v})
	}
	fmt.Fprintf(b.out, "rep %d %-22s at %6.0f req/s (got %6.0f)  p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  p99.9 %.3f ms  errors %v\n",
		rep+1, c.name, rate, r.ActualQPS, r.P50Ms, r.P90Ms, r.P99Ms, r.P999Ms, failed)
	return nil
}

// measureCost runs every configuration once more at wrk's most with the
// kernel's per-program run-time statistics on (they cost two clock reads
// a run, so the timed repetitions run without them), and records each
// program's run time and runs per request served: where the kernel's
// share of a request goes.
func (b *l7Bench) measureCost(ctx context.Context) error {
	stats, err := datapath.EnableRunTimeStats()
	if err != nil {
		return err
	}
	defer stats.Close()
	fmt.Fprintln(b.out, "==> eBPF run time per request (kernel.bpf_stats_enabled), one more run of each configuration")
	for _, c := range l7Configs {
		if err := b.switchTo(ctx, c); err != nil {
			return err
		}
		before, err := datapath.ProgramStats(l7Programs)
		if err != nil {
			return err
		}
		w, err := wrkKeepAlive(ctx, b.client.NetNS, "http://"+b.target(c)+"/", b.o.duration, "")
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		after, err := datapath.ProgramStats(l7Programs)
		if err != nil {
			return err
		}
		served := w.rps * b.o.duration.Seconds()
		if served <= 0 {
			return fmt.Errorf("%s: no request served in the cost run", c.name)
		}
		for _, name := range l7Programs {
			runs := float64(after[name].RunCount - before[name].RunCount)
			ns := float64(after[name].RunTime - before[name].RunTime)
			b.res.Samples = append(b.res.Samples,
				sample{Setup: c.name, Path: l7CostPath, Metric: "ns_per_request/" + name, Value: ns / served},
				sample{Setup: c.name, Path: l7CostPath, Metric: "runs_per_request/" + name, Value: runs / served})
		}
		fmt.Fprintf(b.out, "    %-40s %8.0f req/s (statistics on)\n", c.name, w.rps)
	}
	return nil
}

// kernelCounters reads the server node's in-kernel HTTP reader
// counters (weir_l7_total) from its agent.
func (b *l7Bench) kernelCounters(ctx context.Context) (map[string]float64, error) {
	n, err := b.st.NodeByName(b.server.Node)
	if err != nil {
		return nil, err
	}
	text, err := n.Client().Metrics(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s's metrics: %w", n.Name, err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("%s's metrics: %w", n.Name, err)
	}
	counters := map[string]float64{}
	if f := families["weir_l7_total"]; f != nil {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "counter" {
					counters[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	if _, ok := counters["requests_allowed"]; !ok {
		return nil, fmt.Errorf("%s's metrics have no weir_l7_total{counter=\"requests_allowed\"}: is its L7 path loaded?", n.Name)
	}
	return counters, nil
}

// checkJudged returns how many requests the server node's kernel read
// and allowed since before, and fails unless that fits c: on the L7
// configurations at least 90% of the served requests, none handed to the
// proxy or denied; on the others none at all. A figure of a path the
// requests did not take would be a lie.
func (b *l7Bench) checkJudged(ctx context.Context, c l7Config, before map[string]float64, served float64) (float64, error) {
	after, err := b.kernelCounters(ctx)
	if err != nil {
		return 0, err
	}
	delta := func(k string) float64 { return after[k] - before[k] }
	judged := delta("requests_allowed")
	refused := delta("requests_denied") + delta("streams_refused") + delta("proxy_answered")
	switch c.judged {
	case judgedNone:
		if judged+delta("connections_handed") != 0 {
			return 0, fmt.Errorf("%s: the kernel read %v requests and handed %v connections; no port has HTTP rules", c.name, judged, delta("connections_handed"))
		}
	case judgedKernel:
		if judged < 0.9*served {
			return 0, fmt.Errorf("%s: the kernel read and allowed %v of %v requests served", c.name, judged, served)
		}
		if delta("connections_handed")+refused != 0 {
			return 0, fmt.Errorf("%s: requests handed to the proxy, denied or refused during the load (%v handed, %v denied or refused)",
				c.name, delta("connections_handed"), refused)
		}
	case judgedProxy:
		// Each connection handed at its first request, whose bytes the
		// proxy forwards from then on: at least a request line a request.
		if delta("connections_handed") < l7GateConns || delta("proxy_forwarded_bytes") < 0.9*served*float64(len("GET / HTTP/1.1\r\n\r\n")) {
			return 0, fmt.Errorf("%s: %v connections handed to the proxy and %v bytes forwarded for %v requests served",
				c.name, delta("connections_handed"), delta("proxy_forwarded_bytes"), served)
		}
		if refused != 0 {
			return 0, fmt.Errorf("%s: %v requests denied or refused during the load", c.name, refused)
		}
		judged = delta("connections_handed")
	}
	return judged, nil
}

// judgedMetric names what checkJudged returned for c: requests the
// kernel allowed, or connections handed to the proxy.
func judgedMetric(c l7Config) string {
	if c.judged == judgedProxy {
		return "connections_handed"
	}
	return "requests_judged"
}

// sampleValue is the value of one sample, NaN when there is none.
func (r *result) sampleValue(setup, path, metric string, rep int) float64 {
	for _, s := range r.Samples {
		if s.Setup == setup && s.Path == path && s.Metric == metric && s.Rep == rep {
			return s.Value
		}
	}
	return math.NaN()
}

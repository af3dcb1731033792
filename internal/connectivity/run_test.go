package connectivity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/k8s"
)

// fakeNet is the network the probes see in these tests: it answers
// every dial as a cluster with the policies found in the fake API would,
// records each connection's verdict as the judging agent's flow, and
// records every command run. breakPolicy lets a NetworkPolicy's denied
// traffic through (a datapath failing open), which the test must catch.
type fakeNet struct {
	t           *testing.T
	kube        *fake.Clientset
	dyn         *dynfake.FakeDynamicClient
	ns          string
	breakPolicy bool
	flowsBroken bool // the agents' flows cannot be read

	mu       sync.Mutex
	commands [][]string
	flows    map[string][]api.Flow // by node
}

func (n *fakeNet) Run(ctx context.Context, p k8s.PodRef, command ...string) ([]byte, error) {
	n.mu.Lock()
	n.commands = append(n.commands, append([]string{p.String()}, command...))
	n.mu.Unlock()
	if len(command) < 4 || command[0] != probeBinary || command[1] != "probe" || command[2] != "dial" {
		return nil, fmt.Errorf("unexpected command %q", command)
	}
	flag, target, _ := strings.Cut(command[3], "=")
	r := n.dial(ctx, p.Pod, flag, target)
	return json.Marshal(r)
}

func (n *fakeNet) pod(name string) *corev1.Pod {
	p, err := n.kube.CoreV1().Pods(n.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		n.t.Fatalf("pod %s: %v", name, err)
	}
	return p
}

// dial is one attempt from pod from.
func (n *fakeNet) dial(ctx context.Context, from, flag, target string) Result {
	if flag == "--dns" {
		return Result{OK: true, Outcome: "answered", Resolved: []string{"10.96.0.1"}}
	}
	host, portStr, _ := net.SplitHostPort(target)
	port, _ := strconv.Atoi(portStr)
	if port == 10250 || host == "192.0.2.9" {
		return Result{OK: true, Outcome: "answered"} // a kubelet, the outside
	}
	server := ""
	svc, _ := n.kube.CoreV1().Services(n.ns).Get(ctx, serviceName, metav1.GetOptions{})
	empty, _ := n.kube.CoreV1().Services(n.ns).Get(ctx, serviceNoEndpoints, metav1.GetOptions{})
	switch {
	case host == empty.Spec.ClusterIP:
		return Result{Outcome: "refused", Error: "connection refused", Millis: 0.2}
	case host == svc.Spec.ClusterIP || strings.HasPrefix(host, serviceName+"."):
		server, port = podServerRemote, port-serviceTCPPort+probeTCPPort
	case strings.HasPrefix(host, "10.99.0.") && port == int(svc.Spec.Ports[0].NodePort):
		server, port = podServerRemote, probeTCPPort
	default:
		for _, name := range []string{podServerLocal, podServerRemote} {
			if n.pod(name).Status.PodIP == host {
				server = name
			}
		}
	}
	if server == "" {
		return Result{Outcome: "timeout", Error: "no route"}
	}
	client := n.pod(from)
	srv := n.pod(server)
	// The client's egress policy first, judged at the client's node.
	if egress, err := n.kube.NetworkingV1().NetworkPolicies(n.ns).Get(ctx, egressPolicy(n.ns).Name, metav1.GetOptions{}); err == nil && from == podClient {
		verdict, stage, decider := "denied", "networkpolicy-default-deny", (*api.FlowRule)(nil)
		if (server == podServerLocal && port == probeTCPPort) || n.breakPolicy {
			verdict, stage, decider = "allowed", "networkpolicy", &api.FlowRule{Kind: "NetworkPolicy", Namespace: n.ns, Name: egress.Name}
		}
		n.record(client.Spec.NodeName, api.Flow{Time: time.Now(), Verdict: verdict, Direction: "egress", Pod: n.ns + "/" + from, Stage: stage, Decider: decider,
			Src: net.JoinHostPort(client.Status.PodIP, "40000"), Dst: net.JoinHostPort(srv.Status.PodIP, strconv.Itoa(port)), Rule: "as the fake decided: " + stage})
		if verdict == "denied" {
			return Result{Outcome: "timeout", Error: "i/o timeout"}
		}
	}
	verdict, stage, decider := "allowed", "unenforced", (*api.FlowRule)(nil)
	nps, _ := n.kube.NetworkingV1().NetworkPolicies(n.ns).List(ctx, metav1.ListOptions{})
	if server == podServerRemote && len(nps.Items) > 0 && from != podHostClient {
		if client.Labels["access"] == "granted" {
			stage, decider = "networkpolicy", &api.FlowRule{Kind: "NetworkPolicy", Namespace: n.ns, Name: nps.Items[0].Name}
		} else if !n.breakPolicy {
			verdict, stage = "denied", "networkpolicy-default-deny"
		}
	}
	if _, err := n.dyn.Resource(k8s.ClusterPolicyResource).Get(ctx, cnpName(DefaultNamespace), metav1.GetOptions{}); err == nil &&
		server == podServerLocal && client.Labels["access"] == "granted" {
		verdict, stage, decider = "denied", "admin", &api.FlowRule{Kind: "ClusterNetworkPolicy", Name: cnpName(n.ns)}
	}
	n.record(srv.Spec.NodeName, api.Flow{
		Time: time.Now(), Verdict: verdict, Direction: "ingress", Pod: n.ns + "/" + server, Stage: stage, Decider: decider,
		Src: net.JoinHostPort(client.Status.PodIP, "40000"), Dst: net.JoinHostPort(srv.Status.PodIP, strconv.Itoa(port)),
		Rule: "as the fake decided: " + stage})
	if verdict == "denied" {
		return Result{Outcome: "timeout", Error: "i/o timeout"}
	}
	return Result{OK: true, Outcome: "answered", Answer: &Answer{Pod: server, Client: client.Status.PodIP + ":40000"}}
}

// record is a flow of the agent on node.
func (n *fakeNet) record(node string, f api.Flow) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.flows[node] = append(n.flows[node], f)
}

func (n *fakeNet) readFlows(_ context.Context, node string, q api.FlowsQuery) ([]api.Flow, error) {
	if n.flowsBroken {
		return nil, errors.New("agent pod unreachable")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []api.Flow
	for _, f := range n.flows[node] {
		if f.Pod == q.Pod && strings.HasSuffix(f.Dst, ":"+strconv.Itoa(q.Port)) && !f.Time.Before(q.Since) {
			out = append(out, f)
		}
	}
	return out, nil
}

// newFakeCluster is an API with nodes (n1, n2, ...), an agent DaemonSet
// and a kubelet's worth of behaviour: created pods run at once with an
// address, Services get a ClusterIP.
func newFakeCluster(t *testing.T, nodes int) (*fakeNet, Cluster) {
	t.Helper()
	kube := fake.NewClientset()
	ctx := context.Background()
	for i := 1; i <= nodes; i++ {
		kube.CoreV1().Nodes().Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%d", i)},
			Status: corev1.NodeStatus{
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
				Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.99.0.%d", 10+i)}},
			},
		}, metav1.CreateOptions{})
	}
	next := 1
	kube.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		p.Status.Phase = corev1.PodRunning
		p.Status.PodIP = fmt.Sprintf("10.244.%s.%d", strings.TrimPrefix(p.Spec.NodeName, "n"), next)
		if p.Spec.HostNetwork {
			p.Status.PodIP = "10.99.0.1" + strings.TrimPrefix(p.Spec.NodeName, "n")
		}
		next++
		return false, nil, nil
	})
	nextIP := 50
	kube.PrependReactor("create", "services", func(a k8stesting.Action) (bool, runtime.Object, error) {
		svc := a.(k8stesting.CreateAction).GetObject().(*corev1.Service)
		svc.Spec.ClusterIP = fmt.Sprintf("10.96.0.%d", nextIP)
		nextIP++
		if svc.Spec.Type == corev1.ServiceTypeNodePort {
			for i := range svc.Spec.Ports {
				svc.Spec.Ports[i].NodePort = int32(30080 + i)
			}
		}
		return false, nil, nil
	})
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{k8s.ClusterPolicyResource: "ClusterNetworkPolicyList"})
	n := &fakeNet{t: t, kube: kube, dyn: dyn, ns: DefaultNamespace, flows: map[string][]api.Flow{}}
	return n, Cluster{Kube: kube, Dynamic: dyn, Exec: n, Flows: n.readFlows}
}

func fastConfig() Config {
	return Config{Image: "weir/agent:test", External: "192.0.2.9:443", Timeout: 100 * time.Millisecond, Settle: 300 * time.Millisecond}
}

func TestRunPassesEveryCheckAndCleansUp(t *testing.T) {
	n, c := newFakeCluster(t, 2)
	rep, err := Run(context.Background(), c, fastConfig())
	if err != nil {
		t.Fatalf("run: %v\n%s", err, table(rep))
	}
	if rep.Failed != 0 || rep.Skipped != 0 || rep.Passed != len(rep.Checks) || rep.Passed < 23 {
		t.Errorf("%d passed, %d failed, %d skipped of %d checks, want all of at least 23 passed:\n%s", rep.Passed, rep.Failed, rep.Skipped, len(rep.Checks), table(rep))
	}
	t.Log("\n" + table(rep))
	phases := map[string]int{}
	for _, ck := range rep.Checks {
		phases[ck.Phase]++
		if ck.Want == WantDenied && (ck.Rule == "" || !strings.HasPrefix(ck.Rule, "denied: ")) {
			t.Errorf("%s: denied without the denying flow's rule (%q)", ck.Name, ck.Rule)
		}
	}
	for _, ph := range []string{PhaseNoPolicy, PhaseNetworkPolicy, PhaseClusterPolicy, PhaseEgress} {
		if phases[ph] == 0 {
			t.Errorf("no check in phase %q", ph)
		}
	}
	assertCleanedUp(t, n)
	// Every probe ran the agent's binary in a probe pod of the test's
	// namespace.
	for _, cmd := range n.commands {
		if !strings.HasPrefix(cmd[0], DefaultNamespace+"/") || cmd[1] != probeBinary {
			t.Errorf("ran %q", cmd)
		}
	}
}

func assertCleanedUp(t *testing.T, n *fakeNet) {
	t.Helper()
	ctx := context.Background()
	if _, err := n.kube.CoreV1().Namespaces().Get(ctx, DefaultNamespace, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("namespace left behind (%v)", err)
	}
	if _, err := n.dyn.Resource(k8s.ClusterPolicyResource).Get(ctx, cnpName(DefaultNamespace), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ClusterNetworkPolicy left behind (%v)", err)
	}
}

// A datapath that lets a NetworkPolicy's denied traffic through fails
// the run, names the checks, and still cleans up.
func TestRunCatchesAPolicyFailingOpen(t *testing.T) {
	n, c := newFakeCluster(t, 2)
	n.breakPolicy = true
	rep, err := Run(context.Background(), c, fastConfig())
	if !errors.Is(err, ErrChecksFailed) {
		t.Fatalf("run: %v, want ErrChecksFailed\n%s", err, table(rep))
	}
	var failed []string
	for _, ck := range rep.Checks {
		if !ck.Pass && ck.Skipped == "" {
			failed = append(failed, ck.Name)
			if !strings.Contains(ck.Detail, "let through") {
				t.Errorf("%s: detail %q does not say it was let through", ck.Name, ck.Detail)
			}
		}
	}
	if len(failed) != 4 || rep.Failed != 4 {
		t.Errorf("failed %v (%d), want the four NetworkPolicy denials (three of ingress, one of egress)", failed, rep.Failed)
	}
	if !strings.Contains(table(rep), "FAIL") {
		t.Errorf("the table shows no FAIL:\n%s", table(rep))
	}
	assertCleanedUp(t, n)
}

// A denial, or an admission by a named policy, that no flow records is a
// failure: a timeout alone does not show the policy denied it.
func TestRunWantsDenialsOnRecord(t *testing.T) {
	n, c := newFakeCluster(t, 2)
	n.flowsBroken = true
	rep, err := Run(context.Background(), c, fastConfig())
	if !errors.Is(err, ErrChecksFailed) {
		t.Fatalf("run: %v, want ErrChecksFailed\n%s", err, table(rep))
	}
	for _, ck := range rep.Checks {
		needed := ck.Want == WantDenied || strings.Contains(ck.Name, "admits the client it allows") || strings.Contains(ck.Name, "egress allows")
		if ck.Pass == needed {
			t.Errorf("%s: pass %v with the flows unreadable (%s)", ck.Name, ck.Pass, ck.Detail)
		}
	}
	if rep.Failed != 7 {
		t.Errorf("%d failed, want the 5 denials and the 2 admissions by a named policy", rep.Failed)
	}
}

func TestRunOnOneNodeSkipsWhatNeedsTwo(t *testing.T) {
	_, c := newFakeCluster(t, 1)
	cfg := fastConfig()
	cfg.External = ""
	rep, err := Run(context.Background(), c, cfg)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, table(rep))
	}
	skipped := map[string]string{}
	for _, ck := range rep.Checks {
		if ck.Skipped != "" {
			skipped[ck.Name] = ck.Skipped
		}
	}
	for _, name := range []string{"pod to pod, other node, TCP", "node to pod, other node", "pod to NodePort, other node, TCP", "pod to outside the cluster"} {
		if skipped[name] == "" {
			t.Errorf("%q not skipped with a reason (skipped: %v)", name, skipped)
		}
	}
}

// A namespace left by an earlier run is refused before anything is
// made, with what to do.
func TestRunRefusesALeftoverNamespace(t *testing.T) {
	n, c := newFakeCluster(t, 2)
	n.kube.CoreV1().Namespaces().Create(context.Background(), namespace(DefaultNamespace), metav1.CreateOptions{})
	before := len(n.kube.Actions())
	_, err := Run(context.Background(), c, fastConfig())
	if !errors.Is(err, ErrLeftover) || !strings.Contains(err.Error(), "kubectl delete namespace") {
		t.Fatalf("run: %v, want ErrLeftover saying how to remove it", err)
	}
	for _, a := range n.kube.Actions()[before:] {
		if a.GetVerb() != "get" && a.GetVerb() != "list" {
			t.Errorf("refused run still did %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
}

// Without --image, the probes run the agent DaemonSet's image; with no
// agent DaemonSet the run says Weir is not installed.
func TestRunFindsTheAgentImage(t *testing.T) {
	_, c := newFakeCluster(t, 2)
	cfg := fastConfig()
	cfg.Image = ""
	if _, err := Run(context.Background(), c, cfg); err == nil || !strings.Contains(err.Error(), "is Weir installed?") {
		t.Fatalf("run without an agent DaemonSet: %v", err)
	}
	_, c = newFakeCluster(t, 2)
	_, err := c.Kube.AppsV1().DaemonSets("kube-system").Create(context.Background(), agentDaemonSet("registry.example/weir/agent:v9"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), c, cfg)
	if err != nil || rep.Image != "registry.example/weir/agent:v9" {
		t.Fatalf("run: %v, image %q", err, rep.Image)
	}
}

// agentDaemonSet is the chart's DaemonSet as far as the test looks.
func agentDaemonSet(image string) *appsv1.DaemonSet {
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "weir-agent", Namespace: "kube-system", Labels: map[string]string{"app.kubernetes.io/name": "weir-agent"}},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "install-cni", Image: "other"}, {Name: k8s.AgentContainer, Image: image}}}}},
	}
}

func table(rep *Report) string {
	if rep == nil {
		return ""
	}
	var b strings.Builder
	rep.WriteTable(&b)
	return b.String()
}

package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/lab/manifests"
)

// DemoNamespace holds the demo app.
const DemoNamespace = "demo"

// Demo deploys the two-tier demo app and shows, in a few lines, the
// frontend reaching backends on its own node and on the other node by pod
// address, and through the backend Service by DNS name. It returns an
// error if any call fails.
func Demo(ctx context.Context, st *State, out io.Writer) error {
	r := strings.NewReplacer("IMAGE", AgnhostImage)
	if err := st.applyManifests(ctx, manifests.FS, r, "demo.yaml"); err != nil {
		return err
	}
	start := time.Now()
	for _, d := range []string{"frontend", "backend"} {
		if err := st.WaitDeployment(ctx, DemoNamespace, d, 2*time.Minute); err != nil {
			return err
		}
	}
	c, err := st.Client()
	if err != nil {
		return err
	}
	list, err := c.CoreV1().Pods(DemoNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	pods := map[string]corev1.Pod{}
	var frontends, backends []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		pods[p.Name] = p
		if p.Labels["app"] == "frontend" {
			frontends = append(frontends, p)
		} else {
			backends = append(backends, p)
		}
	}
	sort.Slice(frontends, func(i, j int) bool { return frontends[i].Spec.NodeName < frontends[j].Spec.NodeName })
	sort.Slice(backends, func(i, j int) bool { return backends[i].Spec.NodeName < backends[j].Spec.NodeName })
	fmt.Fprintf(out, "demo app in namespace %s, ready in %s:\n", DemoNamespace, time.Since(start).Round(100*time.Millisecond))
	for _, p := range append(append([]corev1.Pod{}, frontends...), backends...) {
		fmt.Fprintf(out, "  %-26s on %-3s %s\n", p.Name, p.Spec.NodeName, p.Status.PodIP)
	}
	var failed int
	for _, f := range frontends {
		fmt.Fprintf(out, "%s (%s) calls:\n", f.Name, f.Spec.NodeName)
		for _, b := range []corev1.Pod{sameNode(backends, f.Spec.NodeName, true), sameNode(backends, f.Spec.NodeName, false)} {
			if b.Name == "" {
				continue
			}
			where := "same node"
			if b.Spec.NodeName != f.Spec.NodeName {
				where = "other node"
			}
			got, err := st.dial(ctx, f, b.Status.PodIP, 8080)
			failed += report(out, fmt.Sprintf("pod %s (%s, %s)", b.Status.PodIP, b.Name, where), got, err, pods)
		}
		for i := 0; i < 3; i++ {
			got, err := st.dial(ctx, f, "backend."+DemoNamespace+".svc.cluster.local", 80)
			failed += report(out, "Service backend.demo (DNS + ClusterIP)", got, err, pods)
		}
	}
	if failed > 0 {
		return fmt.Errorf("demo: %d calls failed", failed)
	}
	return st.demoPolicy(ctx, frontends, backends, pods, out)
}

// demoPolicy isolates the backends to the frontend tier and shows both
// verdicts: the frontend still gets through, a backend calling another
// backend is dropped, and each node's agent says which rule decided.
func (st *State) demoPolicy(ctx context.Context, frontends, backends []corev1.Pod, pods map[string]corev1.Pod, out io.Writer) error {
	if len(frontends) == 0 || len(backends) < 2 {
		return fmt.Errorf("demo: want a frontend and two backends, have %d and %d", len(frontends), len(backends))
	}
	if err := st.applyManifests(ctx, manifests.FS, nil, "demo-policy.yaml"); err != nil {
		return err
	}
	fmt.Fprintf(out, "NetworkPolicy demo/backend-from-frontend: backends accept only app=frontend on port http\n")
	f, from, to := frontends[0], backends[0], sameNode(backends, backends[0].Spec.NodeName, false)
	if to.Name == "" {
		to = backends[1]
	}
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) { // until the agents have compiled it
		if _, err = st.dial(ctx, from, to.Status.PodIP, 8080); err != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err == nil {
		return fmt.Errorf("demo: %s still reaches %s under the policy", from.Name, to.Name)
	}
	fmt.Fprintf(out, "  denied %s -> %s (%s): the call timed out\n", from.Name, to.Name, to.Spec.NodeName)
	got, err := st.dial(ctx, f, "backend."+DemoNamespace+".svc.cluster.local", 80)
	if report(out, fmt.Sprintf("%s -> Service backend.demo", f.Name), got, err, pods) > 0 {
		return fmt.Errorf("demo: the frontend lost the backend under the policy")
	}
	fmt.Fprintf(out, "verdicts, as `weir observe --lab %s -n demo` shows them:\n", st.Config.Name)
	if err := st.printDemoFlows(ctx, out); err != nil {
		return err
	}
	return st.demoClusterPolicy(ctx, frontends, out)
}

// demoClusterPolicy puts an Admin-tier guardrail over the frontends: a
// frontend calling another is refused at once (Reject), every call into a
// frontend is logged, the policy reports itself programmed on every node,
// and `weir policy trace` explains the verdict and confirms it in the
// loaded eBPF programs.
func (st *State) demoClusterPolicy(ctx context.Context, frontends []corev1.Pod, out io.Writer) error {
	if len(frontends) < 2 {
		return fmt.Errorf("demo: want two frontends, have %d", len(frontends))
	}
	if err := st.applyManifests(ctx, manifests.FS, nil, "demo-cluster-policy.yaml"); err != nil {
		return err
	}
	fmt.Fprintf(out, "WeirClusterNetworkPolicy demo-guard (Admin tier): log every call into a frontend, reject frontend -> frontend\n")
	from, to := frontends[0], frontends[1]
	var (
		err  error
		took time.Duration
	)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) { // until the agents have compiled it
		start := time.Now()
		if _, err = st.dial(ctx, from, to.Status.PodIP, 8080); err != nil {
			took = time.Since(start)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err == nil {
		return fmt.Errorf("demo: %s still reaches %s under demo-guard", from.Name, to.Name)
	}
	if !strings.Contains(err.Error(), "refused") {
		return fmt.Errorf("demo: %s -> %s failed with %v, want a refused connection (the Reject's reset)", from.Name, to.Name, err)
	}
	fmt.Fprintf(out, "  rejected %s -> %s (%s) in %s: %v\n", from.Name, to.Name, to.Spec.NodeName, took.Round(time.Millisecond), err)
	if err := st.printPolicyStatus(ctx, "weirclusternetworkpolicies.weir.io", "", "demo-guard", out); err != nil {
		return err
	}
	if err := st.printDemoTrace(ctx, from, to, out); err != nil {
		return err
	}
	return st.demoHTTPPolicy(ctx, frontends[0], out)
}

// demoHTTPPolicy runs the deathstar: a frontend lands a ship (POST
// /v1/request-landing, allowed by the WeirNetworkPolicy's HTTP rule and
// answered by the deathstar) and tries the exhaust port (PUT
// /v1/exhaust-port, answered 403 in the kernel, on the same connection's
// socket, before the deathstar reads a byte).
func (st *State) demoHTTPPolicy(ctx context.Context, f corev1.Pod, out io.Writer) error {
	r := strings.NewReplacer("IMAGE", AgnhostImage)
	if err := st.applyManifests(ctx, manifests.FS, r, "demo-deathstar.yaml"); err != nil {
		return err
	}
	if err := st.WaitDeployment(ctx, DemoNamespace, "deathstar", 2*time.Minute); err != nil {
		return err
	}
	if err := st.applyManifests(ctx, manifests.FS, nil, "demo-deathstar-policy.yaml"); err != nil {
		return err
	}
	fmt.Fprintf(out, "WeirNetworkPolicy demo/deathstar: the frontend tier may POST /v1/request-landing on port 80, nothing else\n")
	const base = "http://deathstar." + DemoNamespace + ".svc.cluster.local"
	var status, body string
	var err error
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) { // until the agents have compiled it
		if status, body, err = st.httpFrom(ctx, f, "PUT", base+"/v1/exhaust-port"); err == nil && status == "403" {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if err != nil || status != "403" {
		return fmt.Errorf("demo: PUT /v1/exhaust-port from %s: %s %q (%v), want 403 under the policy", f.Name, status, body, err)
	}
	fmt.Fprintf(out, "  %s: PUT  /v1/exhaust-port     -> %s (answered by the kernel; the deathstar never saw it)\n", f.Name, status)
	status, body, err = st.httpFrom(ctx, f, "POST", base+"/v1/request-landing")
	if err != nil || status != "200" || body != "Ship landed" {
		return fmt.Errorf("demo: POST /v1/request-landing from %s: %s %q (%v), want 200 \"Ship landed\"", f.Name, status, body, err)
	}
	fmt.Fprintf(out, "  %s: POST /v1/request-landing -> %s %q (answered by the deathstar)\n", f.Name, status, body)
	if err := st.printPolicyStatus(ctx, "weirnetworkpolicies.weir.io", DemoNamespace, "deathstar", out); err != nil {
		return err
	}
	fmt.Fprintf(out, "requests, as `weir observe --lab %s -n %s --http` shows them:\n", st.Config.Name, DemoNamespace)
	if err := st.printHTTPFlows(ctx, f, out); err != nil {
		return err
	}
	return st.printHTTPTrace(ctx, f, out)
}

// printHTTPFlows waits for the records of the frontend's two requests to
// the deathstar and of the deathstar's answer to the allowed one (the
// records reach the agent within a poll; the answer's when the
// connection closes) and prints them with the rule that decided each.
func (st *State) printHTTPFlows(ctx context.Context, f corev1.Pod, out io.Writer) error {
	want := map[string]string{"PUT": "denied", "POST": "allowed"}
	var found map[string]api.Flow
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		found = map[string]api.Flow{}
		for _, n := range st.Nodes {
			q := api.FlowsQuery{FlowFilter: api.FlowFilter{Namespace: DemoNamespace, Pod: f.Name, HTTP: true}}
			err := n.Client().Flows(ctx, q, func(fl api.Flow) error {
				k := fl.HTTP.Method
				// The allowed request's record once it holds the
				// deathstar's answer (its own, or one of answers alone).
				if k == "POST" && fl.HTTP.Status == 0 {
					return nil
				}
				if want[k] == fl.Verdict && fl.Time.After(found[k].Time) {
					found[k] = fl
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("read flows of %s: %w", n.Name, err)
			}
		}
		if len(found) == len(want) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, m := range []string{"PUT", "POST"} {
		fl, ok := found[m]
		if !ok {
			return fmt.Errorf("demo: no %s record of the frontend's %s to the deathstar within 10 s", want[m], m)
		}
		status, how := "-", ""
		if fl.HTTP.Status != 0 {
			status = fmt.Sprint(fl.HTTP.Status)
		}
		if fl.Verdict == "allowed" {
			how = fmt.Sprintf(" (the deathstar's own answer in %v, read in the kernel as it was sent)", fl.HTTP.Latency.Round(time.Microsecond))
		}
		fmt.Fprintf(out, "  %-7s %-3s %s %s%s <- %s%s\n          by %s\n", fl.Verdict, status, fl.HTTP.Method, fl.HTTP.Host, fl.HTTP.Target, fl.Peer, how, fl.Rule)
	}
	return nil
}

// printHTTPTrace asks the deathstar's node to trace the denied request.
func (st *State) printHTTPTrace(ctx context.Context, f corev1.Pod, out io.Writer) error {
	b, err := st.Kubectl(ctx, nil, "get", "pods", "-n", DemoNamespace, "-l", "app=deathstar", "-o", "jsonpath={.items[0].metadata.name}")
	if err != nil {
		return fmt.Errorf("demo: find the deathstar pod: %w", err)
	}
	q := api.TraceQuery{Src: f.Namespace + "/" + f.Name, Dst: DemoNamespace + "/" + strings.TrimSpace(string(b)), Proto: "TCP", Port: 80,
		HTTP: &api.TraceRequest{Method: "PUT", Path: "/v1/exhaust-port"}}
	fmt.Fprintf(out, "  weir policy trace %s %s 80/tcp --method PUT --path /v1/exhaust-port --lab %s:\n", q.Src, q.Dst, st.Config.Name)
	traces, err := st.traceOnNodes(ctx, q)
	if err != nil {
		return err
	}
	for _, nt := range traces {
		t := nt.trace
		if t.HTTP == nil || t.HTTP.Verdict == "" {
			continue // the frontend's node: HTTP rules are judged at the server
		}
		fmt.Fprintf(out, "    %s: HTTP %s: %s; where: %s\n", nt.node, t.HTTP.Verdict, t.HTTP.Rule, t.HTTP.Kernel)
		if t.HTTP.Verdict != "denied" {
			return fmt.Errorf("demo: trace says PUT /v1/exhaust-port is %s, want denied", t.HTTP.Verdict)
		}
		return nil
	}
	return errors.New("demo: no node traced the HTTP request at the deathstar")
}

// httpFrom makes one HTTP request with curl from inside pod f and
// returns the status code and the body.
func (st *State) httpFrom(ctx context.Context, f corev1.Pod, method, url string) (status, body string, _ error) {
	b, err := st.Kubectl(ctx, nil, "exec", "-n", f.Namespace, f.Name, "--", "curl", "-sS", "-m", "5", "-X", method,
		"-w", "\n%{http_code}", url)
	if err != nil {
		return "", "", err
	}
	text := strings.TrimRight(string(b), "\n")
	i := strings.LastIndexByte(text, '\n')
	return text[i+1:], strings.TrimSpace(text[:max(i, 0)]), nil
}

// printPolicyStatus waits for the policy's Programmed condition and prints
// it; namespace is a namespaced kind's, empty for a cluster kind.
func (st *State) printPolicyStatus(ctx context.Context, resource, namespace, name string, out io.Writer) error {
	var last string
	deadline := time.Now().Add(30 * time.Second)
	args := []string{"get", resource, name, "-o", `jsonpath={range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}`}
	if namespace != "" {
		args = append(args, "-n", namespace)
	}
	for time.Now().Before(deadline) {
		b, err := st.Kubectl(ctx, nil, args...)
		last = string(b)
		if err == nil && strings.Contains(last, "Programmed=True") {
			fmt.Fprintf(out, "  status of %s:\n", name)
			for _, l := range strings.Split(strings.TrimSpace(last), "\n") {
				fmt.Fprintf(out, "    %s\n", l)
			}
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("demo: %s not Programmed on every node within 30 s: %q", name, last)
}

// printDemoTrace asks every node's agent to trace the rejected call; the
// nodes holding its two ends answer.
func (st *State) printDemoTrace(ctx context.Context, from, to corev1.Pod, out io.Writer) error {
	q := api.TraceQuery{Src: from.Namespace + "/" + from.Name, Dst: to.Namespace + "/" + to.Name, Proto: "TCP", Port: 8080}
	fmt.Fprintf(out, "  weir policy trace %s %s 8080/tcp --lab %s:\n", q.Src, q.Dst, st.Config.Name)
	traces, err := st.traceOnNodes(ctx, q)
	if err != nil {
		return err
	}
	for _, nt := range traces {
		n, t := nt.node, nt.trace
		for _, e := range t.Ends {
			by := " by " + e.Compiled.RuleName
			if e.Compiled.RuleName == "" {
				by = " (no policy selects the pod in this direction)"
			}
			fmt.Fprintf(out, "    %s: %s of %s: %s at %s%s\n", n, e.Direction, e.Pod, e.Compiled.Verdict, e.Compiled.Stage, by)
			if e.Compiled.LogName != "" {
				fmt.Fprintf(out, "      logged by %s\n", e.Compiled.LogName)
			}
			if e.Datapath != nil {
				fmt.Fprintf(out, "      datapath (BPF_PROG_RUN through %s): %s at %s, agrees=%v\n", t.Program, e.Datapath.Verdict, e.Datapath.Stage, e.Agree)
			}
		}
		if !t.Agree {
			return fmt.Errorf("demo: the trace on %s disagrees with the datapath", n)
		}
	}
	return nil
}

// nodeTrace is one node's answer to a trace.
type nodeTrace struct {
	node  string
	trace *api.Trace
}

// traceOnNodes asks every node's agent to trace q and returns the
// answers of those holding an end of the flow (at least one).
func (st *State) traceOnNodes(ctx context.Context, q api.TraceQuery) ([]nodeTrace, error) {
	var out []nodeTrace
	for _, n := range st.Nodes {
		t, err := n.Client().Trace(ctx, q)
		if api.CodeOf(err) == api.CodeTraceNotLocal {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("trace on %s: %w", n.Name, err)
		}
		out = append(out, nodeTrace{n.Name, t})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("demo: no node traced %s -> %s", q.Src, q.Dst)
	}
	return out, nil
}

// printDemoFlows prints the latest allowed and denied ingress verdict of
// between the demo's pods from every node's agent.
func (st *State) printDemoFlows(ctx context.Context, out io.Writer) error {
	latest := map[string]api.Flow{}
	for _, n := range st.Nodes {
		q := api.FlowsQuery{FlowFilter: api.FlowFilter{Namespace: DemoNamespace}} // searched on the agent, whole store
		err := n.Client().Flows(ctx, q, func(fl api.Flow) error {
			if fl.HTTP == nil && strings.HasPrefix(fl.Pod, DemoNamespace+"/") && strings.HasPrefix(fl.Peer, DemoNamespace+"/") && fl.Direction == "ingress" && fl.Time.After(latest[fl.Verdict].Time) {
				latest[fl.Verdict] = fl
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("read flows of %s: %w", n.Name, err)
		}
	}
	for _, v := range []string{"allowed", "denied"} {
		fl, ok := latest[v]
		if !ok {
			return fmt.Errorf("demo: no %s verdict recorded for the demo's pods", v)
		}
		fmt.Fprintf(out, "  %-7s %s <- %s %s/%s\n          by %s\n", fl.Verdict, fl.Pod, fl.Peer, fl.Dst, fl.Proto, fl.Rule)
	}
	return nil
}

func sameNode(pods []corev1.Pod, node string, same bool) corev1.Pod {
	for _, p := range pods {
		if (p.Spec.NodeName == node) == same {
			return p
		}
	}
	return corev1.Pod{}
}

func report(out io.Writer, target, answered string, err error, pods map[string]corev1.Pod) int {
	if err != nil {
		fmt.Fprintf(out, "  FAIL %-48s %v\n", target, err)
		return 1
	}
	fmt.Fprintf(out, "  ok   %-48s answered by %s on %s\n", target, answered, pods[answered].Spec.NodeName)
	return 0
}

// dial asks the frontend's netexec to call host:port and say who
// answered: the call is made from inside the frontend pod.
func (st *State) dial(ctx context.Context, from corev1.Pod, host string, port int) (string, error) {
	q := url.Values{"request": {"hostname"}, "host": {host}, "port": {fmt.Sprint(port)}, "protocol": {"http"}, "tries": {"1"}}
	script := fmt.Sprintf(`printf 'GET /dial?%s HTTP/1.0\r\n\r\n' | nc 127.0.0.1 8080 | tail -n 1`, q.Encode())
	b, err := st.Kubectl(ctx, nil, "exec", "-n", from.Namespace, from.Name, "--", "sh", "-c", script)
	if err != nil {
		return "", err
	}
	var res struct {
		Responses []string `json:"responses"`
		Errors    []string `json:"errors"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return "", fmt.Errorf("netexec answered %q: %w", b, err)
	}
	if len(res.Responses) == 0 {
		return "", fmt.Errorf("no answer: %v", res.Errors)
	}
	return res.Responses[0], nil
}

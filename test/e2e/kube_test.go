package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/conformance"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/lab"
)

// webManifest is a Deployment of agnhost netexec spread over the nodes,
// and a Service in front of it.
const webManifest = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 10
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web, tier: backend}}
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: web}}}
      containers:
      - name: web
        image: ` + lab.AgnhostImage + `
        imagePullPolicy: Never
        args: [netexec, --http-port=8080]
        ports: [{containerPort: 8080, name: http}]
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
`

// TestKubernetes runs Weir as the CNI of a real two-node cluster (etcd,
// kube-apiserver, controller manager, scheduler, containerd, kubelet,
// CoreDNS; Weir in place of kube-proxy, the default) and checks what an operator relies on: pods get
// Weir addresses and reach each other, Services and DNS names work,
// exec and logs work, deleted pods free their addresses, the datapath
// survives an agent crash, a rolling restart of the agent DaemonSet and a
// 60 s API server outage, and changes made after the outage are applied.
func TestKubernetes(t *testing.T) {
	st := newKubeLab(t)
	ctx := context.Background()
	c, err := st.Client()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Kubectl(ctx, strings.NewReader(webManifest), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	if err := st.WaitDeployment(ctx, "default", "web", 3*time.Minute); err != nil {
		t.Fatal(err)
	}

	t.Run("pods have Weir addresses on both nodes", func(t *testing.T) {
		pods := webPods(t, c)
		perNode := map[string]int{}
		for _, p := range pods {
			perNode[p.Spec.NodeName]++
		}
		if len(pods) != 10 || perNode["n1"] == 0 || perNode["n2"] == 0 {
			t.Fatalf("want 10 web pods on both nodes, got %v", perNode)
		}
		checkIPAMMatchesAPI(t, st, c)
	})

	t.Run("pod to pod within and across nodes", func(t *testing.T) {
		pods := webPods(t, c)
		for _, from := range []corev1.Pod{onNode(t, pods, "n1"), onNode(t, pods, "n2")} {
			for _, to := range pods {
				out, err := st.Kubectl(ctx, nil, "exec", from.Name, "--", "/agnhost", "connect", to.Status.PodIP+":8080", "--timeout=3s")
				if err != nil {
					t.Errorf("%s (%s) -> %s (%s): %v %s", from.Name, from.Spec.NodeName, to.Name, to.Spec.NodeName, err, out)
				}
			}
		}
	})

	t.Run("pod to Service by ClusterIP and DNS name", func(t *testing.T) {
		pods := webPods(t, c)
		svc, err := c.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, from := range []corev1.Pod{onNode(t, pods, "n1"), onNode(t, pods, "n2")} {
			for _, target := range []string{svc.Spec.ClusterIP + ":80", "web:80", "web.default.svc.cluster.local:80"} {
				for i := 0; i < 3; i++ {
					if out, err := st.Kubectl(ctx, nil, "exec", from.Name, "--", "/agnhost", "connect", target, "--timeout=5s"); err != nil {
						t.Errorf("%s -> %s: %v %s", from.Name, target, err, out)
					}
				}
			}
		}
		// Backends on both nodes answer through the Service.
		seen := map[string]bool{}
		nodes := map[string]bool{}
		from := onNode(t, pods, "n1")
		for i := 0; i < 30 && len(nodes) < 2; i++ {
			out, err := st.Kubectl(ctx, nil, "exec", from.Name, "--", "sh", "-c",
				fmt.Sprintf(`printf 'GET /hostname HTTP/1.0\r\n\r\n' | nc %s 80 | tail -n 1`, svc.Spec.ClusterIP))
			if err != nil {
				t.Fatal(err)
			}
			seen[strings.TrimSpace(string(out))] = true
			for _, p := range pods {
				if seen[p.Name] {
					nodes[p.Spec.NodeName] = true
				}
			}
		}
		if len(nodes) < 2 {
			t.Errorf("Service answered only from %v (hostnames %v)", nodes, seen)
		}
	})

	t.Run("kubectl exec and logs", func(t *testing.T) {
		p := webPods(t, c)[0]
		out, err := st.Kubectl(ctx, nil, "exec", p.Name, "--", "cat", "/etc/resolv.conf")
		if err != nil || !strings.Contains(string(out), lab.ClusterDNSIP.String()) {
			t.Fatalf("exec: %v; resolv.conf %q lacks the cluster DNS", err, out)
		}
		logs, err := st.Kubectl(ctx, nil, "logs", p.Name)
		if err != nil || !strings.Contains(string(logs), "/healthz") {
			t.Fatalf("logs: %v %q", err, logs)
		}
	})

	t.Run("network policy denies silently, allows by label and port, revokes", func(t *testing.T) {
		pods := webPods(t, c)
		client := onNode(t, pods, "n1")
		servers := []corev1.Pod{onNode(t, pods, "n1"), onNode(t, pods, "n2")}
		if servers[0].Name == client.Name {
			for _, p := range pods {
				if p.Spec.NodeName == "n1" && p.Name != client.Name {
					servers[0] = p
				}
			}
		}
		// probe reports "ok", or agnhost's TIMEOUT (dropped) / REFUSED
		// (delivered, nothing listening).
		probeFrom := func(from, target string) string {
			out, err := st.Kubectl(ctx, nil, "exec", from, "--", "/agnhost", "connect", target, "--timeout=2s")
			if err == nil {
				return "ok"
			}
			for _, r := range []string{"TIMEOUT", "REFUSED"} {
				if strings.Contains(string(out), r) {
					return r
				}
			}
			return string(out)
		}
		// expectFrom waits until every server answers from's probe on
		// port with want.
		expectFrom := func(from, port, want string) {
			t.Helper()
			waitFor(t, 10*time.Second, func() error {
				for _, srv := range servers {
					if got := probeFrom(from, srv.Status.PodIP+":"+port); got != want {
						return fmt.Errorf("%s -> %s (%s) port %s: %s, want %s", from, srv.Name, srv.Spec.NodeName, port, got, want)
					}
				}
				return nil
			})
		}
		expect := func(port, want string) {
			t.Helper()
			expectFrom(client.Name, port, want)
		}
		apply := func(yaml string) {
			t.Helper()
			if out, err := st.Kubectl(ctx, strings.NewReader(yaml), "apply", "-f", "-"); err != nil {
				t.Fatalf("apply: %v %s", err, out)
			}
		}
		del := func(name string) {
			if out, err := st.Kubectl(ctx, nil, "delete", "networkpolicy", name, "--ignore-not-found"); err != nil {
				t.Errorf("delete %s: %v %s", name, err, out)
			}
		}
		defer del("deny-web")
		defer del("allow-backend")
		defer del("client-egress")

		apply("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny-web}\n" +
			"spec: {podSelector: {matchLabels: {app: web}}, policyTypes: [Ingress]}\n")
		expect("8080", "TIMEOUT") // dropped, not refused: the client times out
		apply("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: allow-backend}\n" +
			"spec:\n  podSelector: {matchLabels: {app: web}}\n" +
			"  ingress: [{from: [{podSelector: {matchLabels: {tier: backend}}}], ports: [{port: http}]}]\n")
		expect("8080", "ok")      // the named port resolves to 8080 on each server
		expect("8081", "TIMEOUT") // other ports stay closed
		// Both verdicts are on record, each naming what decided it.
		waitFor(t, 5*time.Second, func() error {
			return flowsInclude(ctx, st, servers[1].Spec.NodeName, "default/"+servers[1].Name,
				"networkpolicy default/allow-backend ingress[0]", "default deny")
		})
		del("allow-backend")
		expect("8080", "TIMEOUT")
		del("deny-web")
		expect("8080", "ok")

		// Egress through a Service is judged against the backend it goes
		// to: the socket programs translate the ClusterIP before a packet
		// exists. Judged against the ClusterIP, the allow below would
		// match nothing and every call would time out.
		svc, err := c.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The caller is not a web pod: a Service call a pod makes to
		// itself never leaves it, so no policy judges it.
		caller := "apiVersion: v1\nkind: Pod\nmetadata: {name: egress-client, labels: {role: client}}\n" +
			"spec:\n  nodeName: n1\n  terminationGracePeriodSeconds: 0\n" +
			"  containers: [{name: c, image: " + lab.AgnhostImage + ", imagePullPolicy: Never, args: [pause]}]\n"
		apply(caller)
		defer st.Kubectl(ctx, nil, "delete", "pod", "egress-client", "--wait=true")
		if out, err := st.Kubectl(ctx, nil, "wait", "--for=condition=Ready", "pod/egress-client", "--timeout=60s"); err != nil {
			t.Fatalf("egress-client: %v %s", err, out)
		}
		egress := func(app string) string {
			return "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: client-egress}\n" +
				"spec:\n  podSelector: {matchLabels: {role: client}}\n  policyTypes: [Egress]\n" +
				"  egress: [{to: [{podSelector: {matchLabels: {app: " + app + "}}}], ports: [{port: 8080}]}]\n"
		}
		expectService := func(want string) {
			t.Helper()
			waitFor(t, 10*time.Second, func() error {
				for i := 0; i < 6; i++ { // several backends, on both nodes
					if got := probeFrom("egress-client", svc.Spec.ClusterIP+":80"); got != want {
						return fmt.Errorf("egress-client -> Service %s:80: %s, want %s", svc.Spec.ClusterIP, got, want)
					}
				}
				return nil
			})
		}
		apply(egress("web"))
		expectService("ok")
		expectFrom("egress-client", "8081", "TIMEOUT") // the egress allow is for 8080 only
		apply(egress("nothing"))
		expectService("TIMEOUT")
		del("client-egress")
		expectService("ok")

		// Egress isolation covers the pod's own node too: Kubernetes
		// exempts traffic from the node (kubelet probes), not to it. Under
		// an egress default deny the node's address is closed on the
		// agent's metrics port (the DaemonSet's --metrics-addr, 9880 in
		// the lab) and on a NodePort, through which kube-proxy would
		// otherwise forward to any Service.
		apply("apiVersion: v1\nkind: Service\nmetadata: {name: web-nodeport}\n" +
			"spec: {type: NodePort, selector: {app: web}, ports: [{port: 80, targetPort: 8080}]}\n")
		defer st.Kubectl(ctx, nil, "delete", "service", "web-nodeport", "--ignore-not-found")
		nodePortSvc, err := c.CoreV1().Services("default").Get(ctx, "web-nodeport", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		callerPod, err := c.CoreV1().Pods("default").Get(ctx, "egress-client", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nodeIP := callerPod.Status.HostIP
		metrics := net.JoinHostPort(nodeIP, "9880")
		nodePort := net.JoinHostPort(nodeIP, fmt.Sprint(nodePortSvc.Spec.Ports[0].NodePort))
		expectOwnNode := func(want string) {
			t.Helper()
			waitFor(t, 10*time.Second, func() error {
				// The NodePort twice more: its backends are on both nodes.
				for _, target := range []string{metrics, nodePort, nodePort, nodePort} {
					if got := probeFrom("egress-client", target); got != want {
						return fmt.Errorf("egress-client -> its own node %s (%s): %s, want %s", target, callerPod.Spec.NodeName, got, want)
					}
				}
				return nil
			})
		}
		defer del("client-deny-egress")
		expectOwnNode("ok")
		apply("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: client-deny-egress}\n" +
			"spec: {podSelector: {matchLabels: {role: client}}, policyTypes: [Egress]}\n")
		expectOwnNode("TIMEOUT")
		del("client-deny-egress")
		expectOwnNode("ok")

		// Across nodes, with the client's ingress closed and the server's
		// open only to UDP 8081-8082 from it: a datagram over the MTU and
		// its echo (fragments after the first carry no ports) make the
		// round trip, and a datagram to 8082, where nothing listens, is
		// refused at once (the port unreachable goes with its flow)
		// instead of timing out.
		remoteServer := servers[1].Status.PodIP
		defer del("client-closed")
		defer del("web-udp")
		apply("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: client-closed}\n" +
			"spec: {podSelector: {matchLabels: {role: client}}, policyTypes: [Ingress]}\n")
		apply("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web-udp}\n" +
			"spec:\n  podSelector: {matchLabels: {app: web}}\n" +
			"  ingress: [{from: [{podSelector: {matchLabels: {role: client}}}], ports: [{protocol: UDP, port: 8081, endPort: 8082}]}]\n")
		udpProbe := func(port, data string) string {
			out, err := st.Kubectl(ctx, nil, "exec", "egress-client", "--", "/agnhost", "connect",
				net.JoinHostPort(remoteServer, port), "--protocol=udp", "--timeout=3s", "--udp-data="+data)
			if err == nil {
				return "ok"
			}
			for _, r := range []string{"TIMEOUT", "REFUSED"} {
				if strings.Contains(string(out), r) {
					return r
				}
			}
			return string(out)
		}
		big := "echo " + strings.Repeat("weir", 1000) // 4,005 bytes: three fragments out, two back
		waitFor(t, 15*time.Second, func() error {
			if got := udpProbe("8081", big); got != "ok" {
				return fmt.Errorf("egress-client -> %s:8081 (n2), a %d-byte datagram and its echo: %s, want ok", remoteServer, len(big), got)
			}
			// agnhost waits 3 s: TIMEOUT means the port unreachable was lost.
			if got := udpProbe("8082", "hostname"); got != "REFUSED" {
				return fmt.Errorf("egress-client -> %s:8082 (n2), nothing listening: %s, want REFUSED", remoteServer, got)
			}
			return nil
		})

		out, err := st.Kubectl(ctx, nil, "get", "securityidentities", "-l", "weir.io/namespace=default", "-o", "name")
		if err != nil || len(strings.Fields(string(out))) == 0 {
			t.Errorf("no SecurityIdentity for the default namespace's pods: %v %s", err, out)
		}
	})

	t.Run("a new pod on another node is denied from its first packet", func(t *testing.T) {
		// VXLAN: the control pod's every attempt connects; its identity
		// travels with its first packet.
		expectFreshPodsDenied(t, st, onNode(t, webPods(t, c), "n1"))
	})

	t.Run("NetworkPolicy conformance: fast subsets of cyclonus and the upstream suite", func(t *testing.T) {
		cyclonus, err := conformance.CyclonusTool(ctx, testWriter{t})
		if err != nil {
			t.Fatal(err)
		}
		netpol, err := conformance.NetpolSuite(ctx, testWriter{t})
		if err != nil {
			t.Fatal(err)
		}
		results := t.TempDir()
		// The suites' logs on any failure, a run that could not finish
		// (t.Fatal) included: deferred calls run then too.
		defer func() {
			if t.Failed() {
				dumpFile(t, filepath.Join(results, "cyclonus.log"), 200)
				dumpFile(t, filepath.Join(results, "netpol.log"), 200)
			}
		}()
		for _, run := range []func() (conformance.Result, error){
			func() (conformance.Result, error) {
				return conformance.RunCyclonus(ctx, st, cyclonus, true, results, testWriter{t})
			},
			func() (conformance.Result, error) {
				return conformance.RunNetpolE2E(ctx, st, netpol, true, results, testWriter{t})
			},
		} {
			res, err := run()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s in %.0f s", res, res.Seconds)
			for _, f := range res.Failed {
				t.Errorf("%s: FAILED %s", res.Suite, f)
			}
		}
	})

	t.Run("HTTP policy: method, path (regular expressions too), host and headers allowed and denied in the kernel, a keep-alive connection's second request denied, a split head judged in user space, a closed connection reset, every request on record", func(t *testing.T) {
		pods := webPods(t, c)
		client := onNode(t, pods, "n1")
		server := onNode(t, pods, "n2")
		curl := func(args ...string) []string { t.Helper(); return curlFrom(ctx, st, client, args...) }
		base := "http://" + server.Status.PodIP + ":8080"
		del := applyWebHTTPPolicy(t, ctx, st, client, base)
		defer del()
		for _, tc := range []struct {
			name string
			args []string
			want []string // status, connections opened; per URL
		}{
			{"allowed method and path", []string{base + "/hostname"}, []string{"200", "1"}},
			{"another method", []string{"-X", "DELETE", base + "/hostname"}, []string{"403", "1"}},
			{"another path", []string{base + "/shell?cmd=id"}, []string{"403", "1"}},
			{"the prefix itself, with the rule's host", []string{"-H", "Host: web.allowed", base + "/echo?msg=hi"}, []string{"200", "1"}},
			{"the same path with another host", []string{"-H", "Host: web.other", base + "/echo?msg=hi"}, []string{"403", "1"}},
			{"a path servers read differently", []string{"--path-as-is", base + "/echo/../shell?cmd=id"}, []string{"400", "1"}},
			{"both headers the rule names", []string{"-X", "PUT", "-H", "X-Role: admin", "-H", "X-Trace: 1", base + "/hostname"}, []string{"200", "1"}},
			{"one header missing", []string{"-X", "PUT", "-H", "X-Role: admin", base + "/hostname"}, []string{"403", "1"}},
			{"a value in another case", []string{"-X", "PUT", "-H", "X-Role: Admin", "-H", "X-Trace: 1", base + "/hostname"}, []string{"403", "1"}},
			{"a header the rule names, twice", []string{"-X", "PUT", "-H", "X-Role: admin", "-H", "X-Role: admin", "-H", "X-Trace: 1", base + "/hostname"}, []string{"400", "1"}},
			// A path's regular expression, judged in the kernel by the
			// set's automaton (the query is not part of the path).
			{"a path a regular expression allows", []string{"-X", "POST", base + "/echo?msg=hi"}, []string{"200", "1"}},
			{"a path it does not", []string{"-X", "POST", base + "/echoo?msg=hi"}, []string{"403", "1"}},
			// One connection: the first request served, the second
			// answered 403 on the same connection.
			{"keep-alive: allowed, then denied", []string{base + "/hostname", base + "/shell?cmd=id"}, []string{"200", "1", "403", "0"}},
		} {
			if got := curl(tc.args...); strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("%s: curl %v: %v, want %v", tc.name, tc.args, got, tc.want)
			}
		}
		// An allowed request to upgrade the connection is one the kernel
		// leaves to user space: held back and the connection closed, and
		// the agent resets it at once instead of leaving curl to time out.
		began := time.Now()
		out, _ := st.Kubectl(ctx, nil, "exec", client.Name, "--", "curl", "-s", "-m", "5", "-o", "/dev/null", "-w", "%{http_code} %{exitcode}\n",
			"-H", "Connection: Upgrade", "-H", "Upgrade: websocket", base+"/hostname")
		if f := strings.Fields(string(out)); len(f) < 2 || f[0] != "000" || f[1] != "56" || time.Since(began) > 4*time.Second {
			t.Errorf("an upgrade held back: curl said %q after %v; want no answer and a reset (exit 56) well before its 5 s timeout", out, time.Since(began))
		}
		// A head that arrives in two pieces is assembled and judged in
		// user space (the kernel hands the connection to the node's
		// proxy): the allowed one served, the denied one answered 403.
		split := func(first, rest string) string {
			script := fmt.Sprintf(`exec 3<>/dev/tcp/%s/8080; printf '%s' >&3; sleep 0.3; printf '%s' >&3; timeout 3 cat <&3`,
				server.Status.PodIP, first, rest)
			out, _ := st.Kubectl(ctx, nil, "exec", client.Name, "--", "bash", "-c", script)
			return string(out)
		}
		if got := split("GET /host", `name HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n`); !strings.HasPrefix(got, "HTTP/1.1 200 OK") {
			t.Errorf("an allowed head in two pieces: %q, want it served", got)
		}
		if got := split("GET /she", `ll?cmd=id HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n`); !strings.HasPrefix(got, "HTTP/1.1 403 Forbidden") {
			t.Errorf("a denied head in two pieces: %q, want 403", got)
		}
		// Every request is on record at the server's node, naming the
		// rule that allowed it or the policy whose rules it failed.
		waitHTTPRecords(t, ctx, st, server.Spec.NodeName, "default/"+server.Name, 7, "allowed, denied, host, refused, headers, user space and answer", func(f api.Flow, seen map[string]bool) {
			switch {
			case f.Verdict == "allowed" && f.HTTP.Method == "GET" && f.HTTP.Target == "/hostname" &&
				strings.Contains(f.Rule, "weirnetworkpolicy default/web-http ingress[0] ports[0].http[0] (GET Exact /hostname)"):
				seen["allowed"] = true
			case f.Verdict == "denied" && f.HTTP.Method == "DELETE" && f.HTTP.Status == 403 &&
				f.Rule == "no HTTP rule allows it: weirnetworkpolicy default/web-http ingress[0]":
				seen["denied"] = true
			case f.Verdict == "denied" && f.HTTP.Host == "web.other" && f.HTTP.Target == "/echo?msg=hi":
				seen["host"] = true
			case f.Verdict == "refused" && f.HTTP.Status == 400:
				seen["refused"] = true
			case f.Verdict == "allowed" && f.HTTP.Method == "PUT" && strings.Contains(strings.ToLower(f.Rule), `ports[0].http[2] (put exact /hostname header x-role exact "admin"`):
				seen["headers"] = true
			}
			// The server's answer to an allowed request, read in the
			// kernel as it was sent: in the request's record, or in a
			// record of its own named by the request and its rule.
			if f.Verdict == "allowed" && f.HTTP.Status == 200 && f.HTTP.Target == "/hostname" && f.HTTP.Latency > 0 &&
				f.HTTP.LatencyMax >= f.HTTP.Latency && strings.Contains(f.Rule, "ports[0].http[0] (GET Exact /hostname)") {
				seen["answer"] = true
			}
			// Also the allowed GET /hostname above when it came in
			// two pieces.
			if f.Verdict == "allowed" && f.HTTP.Target == "/hostname" && strings.HasSuffix(f.Rule, "(judged in user space)") {
				seen["user space"] = true
			}
		})
	})

	t.Run("HTTP egress policy: a client's requests judged on its own socket, a denied one answered 403 in the server's place, a keep-alive connection's second request denied, a header regex judged by the node's proxy from the client's socket, every request on record as egress", func(t *testing.T) {
		pods := webPods(t, c)
		client := onNode(t, pods, "n1")
		server := onNode(t, pods, "n2")
		base := "http://" + server.Status.PodIP + ":8080"
		defer restrictEgress(t, ctx, st, client, "egress-http", "client-egress-http", egressHTTPPolicy)()
		waitFor(t, 15*time.Second, func() error {
			if got := curlFrom(ctx, st, client, base+"/shell?cmd=id"); len(got) < 1 || got[0] != "403" {
				return fmt.Errorf("GET /shell: %v, want 403 once the egress policy is loaded", got)
			}
			return nil
		})
		for _, tc := range []struct {
			name string
			args []string
			want []string // status, connections opened; per URL
		}{
			{"allowed", []string{base + "/hostname"}, []string{"200", "1"}},
			{"another path", []string{base + "/shell?cmd=id"}, []string{"403", "1"}},
			{"another method", []string{"-X", "DELETE", base + "/hostname"}, []string{"403", "1"}},
			// One -o per URL after the first (curlFrom gives that one):
			// the answers' bodies stay off the output.
			{"keep-alive: allowed, then denied, then allowed", []string{"-o", "/dev/null", "-o", "/dev/null",
				base + "/hostname", base + "/shell?cmd=id", base + "/hostname"}, []string{"200", "1", "403", "0", "200", "0"}},
			// A header value regex is judged in user space: the
			// connection goes to the node's proxy from the client's
			// socket at that request, and the proxy judges the rest.
			{"header regex matched", []string{"-H", "X-Team: bluuue", base + "/echo?msg=hi"}, []string{"200", "1"}},
			{"header regex not matched", []string{"-H", "X-Team: red", base + "/echo?msg=hi"}, []string{"403", "1"}},
			{"keep-alive through the proxy: allowed, allowed, denied, allowed", []string{"-H", "X-Team: bluuue",
				"-o", "/dev/null", "-o", "/dev/null", "-o", "/dev/null",
				base + "/echo?msg=hi", base + "/hostname", base + "/shell?cmd=id", base + "/echo?msg=again"},
				[]string{"200", "1", "200", "0", "403", "0", "200", "0"}},
		} {
			if got := curlFrom(ctx, st, client, tc.args...); strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("%s: curl %v: %v, want %v", tc.name, tc.args, got, tc.want)
			}
		}
		// The records are at the client's node, as its egress verdicts.
		waitHTTPRecords(t, ctx, st, client.Spec.NodeName, "default/"+client.Name, 5, "allowed, denied, answer, and the proxy's allowed and denied", func(f api.Flow, seen map[string]bool) {
			if f.Direction != "egress" {
				return
			}
			switch {
			case f.Verdict == "allowed" && f.HTTP.Target == "/hostname" &&
				strings.Contains(f.Rule, "weirnetworkpolicy default/client-egress-http egress[0] ports[0].http[0] (GET Exact /hostname)"):
				seen["allowed"] = true
			case f.Verdict == "denied" && f.HTTP.Method == "DELETE" && f.HTTP.Status == 403 &&
				f.Rule == "no HTTP rule allows it: weirnetworkpolicy default/client-egress-http egress[0]":
				seen["denied"] = true
			}
			// The server's answer, read as it reached the client.
			if f.Verdict == "allowed" && f.HTTP.Status == 200 && f.HTTP.Target == "/hostname" && f.HTTP.Latency > 0 {
				seen["answer"] = true
			}
			if strings.HasSuffix(f.Rule, "(judged in user space)") {
				switch {
				case f.Verdict == "allowed" && f.HTTP.Target == "/echo?msg=again" &&
					strings.Contains(f.Rule, "weirnetworkpolicy default/client-egress-http egress[0] ports[0].http[1]"):
					seen["proxy allowed"] = true
				case f.Verdict == "denied" && f.HTTP.Target == "/shell?cmd=id":
					seen["proxy denied"] = true
				}
			}
		})
	})

	t.Run("HTTP rules in the cluster tiers: a conditional Deny answers 403 whatever follows, a conditional Accept before a Deny of all lets only its requests through, on one keep-alive connection, each request on record with its cluster rule", func(t *testing.T) {
		pods := webPods(t, c)
		client := onNode(t, pods, "n1")
		server := onNode(t, pods, "n2")
		curl := func(args ...string) []string { t.Helper(); return curlFrom(ctx, st, client, args...) }
		base := "http://" + server.Status.PodIP + ":8080"
		if out, err := st.Kubectl(ctx, strings.NewReader(webTierPolicy), "apply", "-f", "-"); err != nil {
			t.Fatalf("apply web-http-tiers: %v %s", err, out)
		}
		defer func() {
			if out, err := st.Kubectl(ctx, nil, "delete", "weirclusternetworkpolicies.weir.io", "web-http-tiers", "--ignore-not-found"); err != nil {
				t.Errorf("delete web-http-tiers: %v %s", err, out)
			}
			waitFor(t, 15*time.Second, func() error {
				if got := curl(base + "/echo?msg=hi"); len(got) < 1 || got[0] != "200" {
					return fmt.Errorf("GET /echo after the policy's deletion: %v, want 200", got)
				}
				return nil
			})
		}()
		waitFor(t, 15*time.Second, func() error {
			if got := curl(base + "/echo?msg=hi"); len(got) < 1 || got[0] != "403" {
				return fmt.Errorf("GET /echo: %v, want 403 once the policy is loaded", got)
			}
			return nil
		})
		for _, tc := range []struct {
			name string
			args []string
			want []string // status, connections opened; per URL
		}{
			{"the conditional Accept's request", []string{base + "/hostname"}, []string{"200", "1"}},
			{"the conditional Deny's request", []string{base + "/shell?cmd=id"}, []string{"403", "1"}},
			{"neither: the Deny of all after them", []string{base + "/echo?msg=hi"}, []string{"403", "1"}},
			// curl's -o names the first URL's output: one per URL.
			{"keep-alive: allowed, denied, allowed", []string{base + "/hostname", "-o", "/dev/null", base + "/shell?cmd=id", "-o", "/dev/null", base + "/hostname"},
				[]string{"200", "1", "403", "0", "200", "0"}},
		} {
			if got := curl(tc.args...); strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("%s: curl %v: %v, want %v", tc.name, tc.args, got, tc.want)
			}
		}
		waitHTTPRecords(t, ctx, st, server.Spec.NodeName, "default/"+server.Name, 3, "accepted, denied by its HTTP rule and by the rule after", func(f api.Flow, seen map[string]bool) {
			if f.Decider == nil || f.Decider.Name != "web-http-tiers" || !strings.HasSuffix(f.Rule, "(judged in user space)") {
				return
			}
			switch {
			case f.Verdict == "allowed" && f.HTTP.Target == "/hostname" && strings.Contains(f.Rule, `"hostname" Accept http[0] (GET Exact /hostname)`):
				seen["accepted"] = true
			case f.Verdict == "denied" && f.HTTP.Target == "/shell?cmd=id" && f.HTTP.Status == 403 && strings.Contains(f.Rule, `"no-shell" Deny http[0] (PathPrefix /shell)`):
				seen["denied by its HTTP rule"] = true
			case f.Verdict == "denied" && f.HTTP.Target == "/echo?msg=hi" && strings.Contains(f.Rule, `"rest" Deny, a rule without HTTP rules`):
				seen["denied by the rule after"] = true
			}
		})
	})

	t.Run("HTTP2 over cleartext (h2c, gRPC) policy: a real gRPC server's calls judged by the node's proxy, an allowed method served and another answered 403 on the same connection, each call on record with the server's status, and the same judged on the client's side by its egress rules", func(t *testing.T) {
		client := onNode(t, webPods(t, c), "n1")
		if out, err := st.Kubectl(ctx, strings.NewReader(grpcServerPod), "apply", "-f", "-"); err != nil {
			t.Fatalf("apply grpc-server: %v %s", err, out)
		}
		defer st.Kubectl(ctx, nil, "delete", "pod", "grpc-server", "--wait=false")
		if out, err := st.Kubectl(ctx, nil, "wait", "--for=condition=Ready", "pod/grpc-server", "--timeout=60s"); err != nil {
			t.Fatalf("grpc-server not ready: %v %s", err, out)
		}
		server, err := c.CoreV1().Pods("default").Get(ctx, "grpc-server", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		base := "http://" + server.Status.PodIP + ":5000/grpc.health.v1.Health/"
		call := func(urls ...string) string { t.Helper(); return grpcCall(ctx, st, client, urls...) }
		waitFor(t, 15*time.Second, func() error {
			if got := call(base + "Check"); got != "200 2 1" {
				return fmt.Errorf("Check with no policy: %q, want 200 over HTTP/2", got)
			}
			return nil
		})
		if out, err := st.Kubectl(ctx, strings.NewReader(grpcHTTPPolicy), "apply", "-f", "-"); err != nil {
			t.Fatalf("apply grpc-http: %v %s", err, out)
		}
		defer func() {
			if out, err := st.Kubectl(ctx, nil, "delete", "weirnetworkpolicies.weir.io", "grpc-http", "--ignore-not-found"); err != nil {
				t.Errorf("delete grpc-http: %v %s", err, out)
			}
		}()
		waitFor(t, 15*time.Second, func() error {
			if got := call(base + "Watch"); got != "403 2 1" {
				return fmt.Errorf("Watch: %q, want 403 once the policy is loaded", got)
			}
			return nil
		})
		for _, tc := range []struct {
			name string
			urls []string
			want string // status, HTTP version, connections opened
		}{
			{"the allowed call", []string{base + "Check"}, "200 2 1"},
			{"another method of the service", []string{base + "Watch"}, "403 2 1"},
		} {
			if got := call(tc.urls...); got != tc.want {
				t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
			}
		}
		// One connection, as a gRPC client keeps it: the denied call
		// answered on its own stream, the calls around it served with
		// their grpc-status trailer.
		if got := grpcOneConn(t, st, client, server.Status.PodIP+":5000", "Check", "Watch", "Check"); got != "200 0 403 - 200 0" {
			t.Errorf("one connection: allowed, denied, allowed: %q, want 200 0 403 - 200 0", got)
		}
		waitHTTPRecords(t, ctx, st, server.Spec.NodeName, "default/grpc-server", 2, "the allowed call with its status and the denied one", func(f api.Flow, seen map[string]bool) {
			if f.HTTP == nil || !strings.HasSuffix(f.Rule, "(judged in user space)") {
				return
			}
			switch {
			case f.Verdict == "allowed" && f.HTTP.Method == "POST" && f.HTTP.Target == "/grpc.health.v1.Health/Check" && f.HTTP.Status == 200 &&
				f.HTTP.Latency > 0 && strings.Contains(f.Rule, "weirnetworkpolicy default/grpc-http ingress[0] ports[0].http[0] (POST Exact /grpc.health.v1.Health/Check)"):
				seen["allowed"] = true
			case f.Verdict == "denied" && f.HTTP.Target == "/grpc.health.v1.Health/Watch" && f.HTTP.Status == 403:
				seen["denied"] = true
			}
		})

		// The same rule as the client's egress rule: its h2c connection
		// is handed to its own node's proxy from its socket.
		if out, err := st.Kubectl(ctx, nil, "delete", "weirnetworkpolicies.weir.io", "grpc-http"); err != nil {
			t.Fatalf("delete grpc-http: %v %s", err, out)
		}
		defer restrictEgress(t, ctx, st, client, "egress-grpc", "grpc-egress", grpcEgressPolicy)()
		waitFor(t, 15*time.Second, func() error {
			if got := call(base + "Watch"); got != "403 2 1" {
				return fmt.Errorf("Watch: %q, want 403 once the egress policy is loaded", got)
			}
			return nil
		})
		if got := call(base + "Check"); got != "200 2 1" {
			t.Errorf("the allowed call, egress: %q, want 200 2 1", got)
		}
		waitHTTPRecords(t, ctx, st, client.Spec.NodeName, "default/"+client.Name, 2, "the allowed call with its status and the denied one", func(f api.Flow, seen map[string]bool) {
			if f.HTTP == nil || f.Direction != "egress" || !strings.HasSuffix(f.Rule, "(judged in user space)") {
				return
			}
			switch {
			case f.Verdict == "allowed" && f.HTTP.Target == "/grpc.health.v1.Health/Check" && f.HTTP.Status == 200 &&
				strings.Contains(f.Rule, "weirnetworkpolicy default/grpc-egress egress[0] ports[0].http[0]"):
				seen["allowed"] = true
			case f.Verdict == "denied" && f.HTTP.Target == "/grpc.health.v1.Health/Watch" && f.HTTP.Status == 403:
				seen["denied"] = true
			}
		})
	})

	t.Run("demo: pods talk, NetworkPolicy drops, a WeirClusterNetworkPolicy rejects at once, is Programmed on every node, trace agrees with the datapath, and a WeirNetworkPolicy's HTTP rule lands the ship and answers the exhaust port 403", func(t *testing.T) {
		t.Cleanup(func() {
			for _, args := range [][]string{
				{"delete", "weirclusternetworkpolicies.weir.io", "demo-guard", "--ignore-not-found"},
				{"delete", "namespace", lab.DemoNamespace, "--ignore-not-found", "--wait=true", "--timeout=120s"},
			} {
				if out, err := st.Kubectl(ctx, nil, args...); err != nil {
					t.Errorf("kubectl %v: %v: %s", args, err, out)
				}
			}
		})
		var out strings.Builder
		err := lab.Demo(ctx, st, &out)
		t.Log(out.String())
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"rejected", "Programmed=True ProgrammedOnAllNodes", "agrees=true", "logged by",
			"PUT  /v1/exhaust-port     -> 403", `POST /v1/request-landing -> 200 "Ship landed"`,
			"by no HTTP rule allows it: weirnetworkpolicy demo/deathstar ingress[0]",
			"by weirnetworkpolicy demo/deathstar ingress[0] ports[0].http[0] (POST Exact /v1/request-landing)",
			"HTTP denied: answered 403", "allowed 200 POST ", "the deathstar's own answer in ",
			"status of deathstar:\n    Accepted=True Valid"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("demo output lacks %q", want)
			}
		}
	})

	t.Run("ClusterNetworkPolicy conformance: fast subset of the upstream suite", func(t *testing.T) {
		bin, err := conformance.CNPSuite(ctx, testWriter{t})
		if err != nil {
			t.Fatal(err)
		}
		results := t.TempDir()
		res, err := conformance.RunCNP(ctx, st, bin, true, results, testWriter{t})
		checkConformance(t, res, err, filepath.Join(results, "cnp.log"))
	})

	t.Run("the benchmarks' load tools run in pods", func(t *testing.T) {
		tools := `
apiVersion: v1
kind: Pod
metadata: {name: iperf-server, labels: {app: tools}}
spec:
  nodeName: n2
  terminationGracePeriodSeconds: 0
  containers: [{name: s, image: ` + lab.LoadToolsImage + `, imagePullPolicy: Never, command: [iperf3, -s]}]
---
apiVersion: v1
kind: Pod
metadata: {name: tools-client, labels: {app: tools}}
spec:
  nodeName: n1
  terminationGracePeriodSeconds: 0
  containers: [{name: c, image: ` + lab.LoadToolsImage + `, imagePullPolicy: Never, command: [sleep, "3600"]}]
`
		if _, err := st.Kubectl(ctx, strings.NewReader(tools), "apply", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		defer st.Kubectl(ctx, nil, "delete", "pod", "-l", "app=tools", "--wait=false")
		if _, err := st.Kubectl(ctx, nil, "wait", "--for=condition=Ready", "pod", "-l", "app=tools", "--timeout=60s"); err != nil {
			t.Fatal(err)
		}
		srv, err := c.CoreV1().Pods("default").Get(ctx, "iperf-server", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []byte
		waitFor(t, 10*time.Second, func() error { // until iperf3 listens
			out, err = st.Kubectl(ctx, nil, "exec", "tools-client", "--", "iperf3", "-c", srv.Status.PodIP, "-t", "1")
			return err
		})
		if !strings.Contains(string(out), "receiver") {
			t.Fatalf("iperf3 across nodes: %s", out)
		}
		for _, tool := range [][]string{{"sockperf", "--version"}, {"wrk", "--version"}} {
			if out, err := st.Kubectl(ctx, nil, append([]string{"exec", "tools-client", "--"}, tool...)...); err != nil && !strings.Contains(string(out), "wrk ") {
				t.Errorf("%s in the loadtools image: %v %s", tool[0], err, out)
			}
		}
	})

	t.Run("deleting pods frees their addresses", func(t *testing.T) {
		if _, err := st.Kubectl(ctx, nil, "scale", "deployment/web", "--replicas=4"); err != nil {
			t.Fatal(err)
		}
		if err := st.WaitDeployment(ctx, "default", "web", 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 60*time.Second, func() error {
			if n := len(webPods(t, c)); n != 4 {
				return fmt.Errorf("%d web pods, want 4", n)
			}
			return ipamMatchesAPI(st, c)
		})
		// A scale-down may keep all four on one node (the ReplicaSet picks
		// among equally ranked pods at random); the tests below need one
		// on each, and the spread constraint places new ones on the
		// emptier node.
		if _, err := st.Kubectl(ctx, nil, "scale", "deployment/web", "--replicas=6"); err != nil {
			t.Fatal(err)
		}
		if err := st.WaitDeployment(ctx, "default", "web", 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 60*time.Second, func() error {
			nodes := map[string]bool{}
			for _, p := range webPods(t, c) {
				nodes[p.Spec.NodeName] = true
			}
			if !nodes["n1"] || !nodes["n2"] {
				return fmt.Errorf("web pods on %v, want both nodes", nodes)
			}
			return ipamMatchesAPI(st, c)
		})
	})

	t.Run("agent crash keeps connections, Service connections and pods", func(t *testing.T) {
		pods := webPods(t, c)
		client, server := onNode(t, pods, "n1"), onNode(t, pods, "n2")
		svc, err := c.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Through the Service, with no kube-proxy: an established flow
		// and new ones every 50 ms, while the agents that balance them
		// are gone and come back (the maps and socket programs are
		// pinned; the new agent writes only what changed).
		load, err := startServiceLoad(podNS(t, st, client), svc.Spec.ClusterIP+":80")
		if err != nil {
			t.Fatal(err)
		}
		defer load.stop()
		sent, adopted := undisturbed(t, st, client, server, func() {
			for _, n := range []string{"n1", "n2"} {
				// kubelet restarts the DaemonSet's container.
				if err := st.KillAgent(n); err != nil {
					t.Fatal(err)
				}
				waitAgents(t, st)
			}
		})
		if sent < 50 {
			t.Fatalf("only %d echoes went through", sent)
		}
		t.Logf("%d echoes across two agent crashes (kubelet restarted them), %d endpoints adopted unchanged", sent, adopted)
		res := load.stop()
		if res.KeptErr != nil {
			t.Errorf("the established Service connection broke: %v", res.KeptErr)
		}
		if len(res.KeptFrom) != 1 {
			t.Errorf("the established Service connection was answered by %v, want one backend throughout", res.KeptFrom)
		}
		if res.FreshFailed > 0 {
			t.Errorf("%d of %d new Service connections failed during the crashes, first: %v", res.FreshFailed, res.Fresh+res.FreshFailed, res.FreshErr)
		}
		// Still balanced: with 6 backends, 20 or more new connections
		// that all landed on fewer than 3 would mean a stuck pick.
		if res.Fresh < 20 || len(res.FreshFrom) < 3 {
			t.Errorf("%d new Service connections answered by %d backends (%v), want at least 20 over at least 3", res.Fresh, len(res.FreshFrom), res.FreshFrom)
		}
		t.Logf("through the Service across the crashes: %d requests on one established connection, %d of %d new connections answered by %d backends",
			res.Kept, res.Fresh, res.Fresh+res.FreshFailed, len(res.FreshFrom))
	})

	t.Run("HTTP policy holds while agents crash: allowed requests keep flowing on a kept connection and new ones, denied ones stay 403", func(t *testing.T) {
		pods := webPods(t, c)
		client, server := onNode(t, pods, "n1"), onNode(t, pods, "n2")
		addr := server.Status.PodIP + ":8080"
		del := applyWebHTTPPolicy(t, ctx, st, client, "http://"+addr)
		defer del()
		// GET /hostname, allowed: one kept keep-alive connection and a
		// new connection every 50 ms; POST /hostname, denied: a new
		// connection every 50 ms.
		allowed, err := startServiceLoad(podNS(t, st, client), addr)
		if err != nil {
			t.Fatal(err)
		}
		defer allowed.stop()
		denied := startDeniedLoad(podNS(t, st, client), addr)
		defer denied.stop()
		for _, n := range []string{"n1", "n2"} {
			if err := st.KillAgent(n); err != nil {
				t.Fatal(err)
			}
			waitAgents(t, st)
		}
		a, d := allowed.stop(), denied.stop()
		if a.KeptErr != nil {
			t.Errorf("the kept connection broke: %v", a.KeptErr)
		}
		if a.FreshFailed > 0 {
			t.Errorf("%d of %d new connections' allowed requests failed, first: %v", a.FreshFailed, a.Fresh+a.FreshFailed, a.FreshErr)
		}
		if d.Passed > 0 || d.Failed > 0 {
			t.Errorf("denied requests: %d answered 403, %d reached the server, %d failed otherwise (first: %v)", d.Denied, d.Passed, d.Failed, d.Err)
		}
		if a.Kept < 50 || a.Fresh < 20 || d.Denied < 20 {
			t.Errorf("too little load to tell: %d requests kept, %d new allowed, %d denied", a.Kept, a.Fresh, d.Denied)
		}
		t.Logf("across two agent crashes: %d requests on a kept connection, %d new connections allowed, %d denied requests answered 403, none passed",
			a.Kept, a.Fresh, d.Denied)
	})

	t.Run("rolling restart of the agent DaemonSet drops nothing", func(t *testing.T) {
		pods := webPods(t, c)
		client, server := onNode(t, pods, "n2"), onNode(t, pods, "n1")
		sent, _ := undisturbed(t, st, client, server, func() {
			if _, err := st.Kubectl(ctx, nil, "-n", "kube-system", "rollout", "restart", "daemonset/weir-agent"); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Kubectl(ctx, nil, "-n", "kube-system", "rollout", "status", "daemonset/weir-agent", "--timeout=3m"); err != nil {
				t.Fatal(err)
			}
			waitAgents(t, st)
		})
		t.Logf("%d echoes across a rolling restart of both agents", sent)
	})

	t.Run("API server outage", func(t *testing.T) {
		pods := webPods(t, c)
		client, server := onNode(t, pods, "n1"), onNode(t, pods, "n2")
		conn, stopEcho := echoBetween(t, st, client, server)
		defer stopEcho()
		traffic := keepTalking(conn)
		if err := st.StopServer("kube-apiserver"); err != nil {
			t.Fatal(err)
		}
		clientNS := podNS(t, st, client)
		outage := 60 * time.Second
		if d := os.Getenv("WEIR_E2E_API_OUTAGE"); d != "" {
			outage, _ = time.ParseDuration(d)
		}
		deadline := time.Now().Add(outage)
		probes := 0
		for time.Now().Before(deadline) {
			// New connections to every pod, across nodes, with no API server.
			for _, p := range pods {
				c := dialIn(t, clientNS, net.JoinHostPort(p.Status.PodIP, "8080"))
				c.Close()
				probes++
			}
			time.Sleep(time.Second)
		}
		if err := st.StartServer("kube-apiserver"); err != nil {
			t.Fatal(err)
		}
		sent, err := traffic.stop()
		if err != nil {
			t.Fatalf("established connection broke during the outage: %v", err)
		}
		t.Logf("API server down %s: %d new connections and %d echoes on an old one all went through", outage, probes, sent)
		waitAgents(t, st)

		// Changes made after the API server returns are applied.
		back := time.Now()
		waitFor(t, 90*time.Second, func() error {
			_, err := st.Kubectl(ctx, nil, "scale", "deployment/web", "--replicas=8")
			return err
		})
		t.Logf("API server answering %s after its start", time.Since(back).Round(100*time.Millisecond))
		if err := st.WaitDeployment(ctx, "default", "web", 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		t.Logf("scaled to 8 after %s", time.Since(back).Round(100*time.Millisecond))
		waitFor(t, 60*time.Second, func() error { return ipamMatchesAPI(st, c) })
		t.Logf("agents' leases match the API after %s", time.Since(back).Round(100*time.Millisecond))
		fresh := webPods(t, c)
		for _, p := range fresh {
			c := dialIn(t, clientNS, net.JoinHostPort(p.Status.PodIP, "8080"))
			c.Close()
		}
		for _, n := range st.Nodes {
			waitFor(t, 60*time.Second, func() error {
				s, err := n.Client().Status(ctx)
				if err != nil {
					return err
				}
				if k := s.Kubernetes; k == nil || !k.Synced || k.ReportError != "" || k.Reported.Before(back) {
					return fmt.Errorf("agent %s has not reported since the API server returned: %+v", n.Name, k)
				}
				return nil
			})
		}
		t.Logf("agents reported to the API server again after %s", time.Since(back).Round(100*time.Millisecond))
	})
}

// newKubeLab brings up a Kubernetes lab that is torn down when the test ends.
func newKubeLab(t *testing.T) *lab.State {
	t.Helper()
	return newKubeLabConfig(t, lab.Config{Mode: datapath.ModeVXLAN})
}

// newKubeLabConfig is newKubeLab with cfg's mode, Service proxy and release.
func newKubeLabConfig(t *testing.T, cfg lab.Config) *lab.State {
	t.Helper()
	mode := cfg.Mode
	if mode == "" {
		mode = datapath.ModeVXLAN
	}
	labCounter++
	name := fmt.Sprintf("wk%d-%d", os.Getpid()%1000, labCounter)
	t.Cleanup(func() {
		if err := lab.Down(context.Background(), name, io.Discard); err != nil {
			t.Errorf("lab down: %v", err)
		}
		checkNoTrace(t, name)
	})
	st, err := lab.Up(context.Background(), lab.Config{Name: name, Nodes: 2, Mode: mode, BinDir: binDir, Kubernetes: true, KubeProxy: cfg.KubeProxy, Release: cfg.Release, CNI: cfg.CNI}, testWriter{t})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	return st
}

// checkNoTrace fails if the lab left a namespace, mount, cgroup or
// process of its own behind.
func checkNoTrace(t *testing.T, name string) {
	if left, _ := os.ReadDir("/var/run/netns"); len(left) > 0 {
		for _, e := range left {
			if strings.HasPrefix(e.Name(), name+"-") {
				t.Errorf("lab down left namespace %s", e.Name())
			}
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mounts), "\n") {
		if strings.Contains(l, "/"+name+"/") || strings.Contains(l, "/"+name+" ") {
			t.Errorf("lab down left a mount: %s", l)
		}
	}
	for _, dir := range []string{"/run/" + name, "/var/lib/" + name, "/sys/fs/bpf/" + name} {
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("lab down left %s", dir)
		}
	}
	// Every hierarchy, the hybrid cgroup2 mount included.
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/" + name + "-*")
	for _, dir := range cgroups {
		t.Errorf("lab down left cgroup %s", dir)
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		cmd, err := os.ReadFile("/proc/" + p.Name() + "/cmdline")
		if err == nil && strings.Contains(string(cmd), "/run/"+name+"/") {
			t.Errorf("lab down left process %s: %s", p.Name(), strings.ReplaceAll(string(cmd), "\x00", " "))
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func webPods(t *testing.T, c kubernetes.Interface) []corev1.Pod {
	t.Helper()
	list, err := c.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Status.PodIP != "" {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func onNode(t *testing.T, pods []corev1.Pod, node string) corev1.Pod {
	t.Helper()
	for _, p := range pods {
		if p.Spec.NodeName == node {
			return p
		}
	}
	t.Fatalf("no pod on %s", node)
	return corev1.Pod{}
}

func checkIPAMMatchesAPI(t *testing.T, st *lab.State, c kubernetes.Interface) {
	t.Helper()
	if err := ipamMatchesAPI(st, c); err != nil {
		t.Fatal(err)
	}
}

// ipamMatchesAPI checks that each agent leases exactly the addresses of
// the pods the API server places on its node, each inside the node's pod
// CIDR, named after its pod, with the pod's labels.
func ipamMatchesAPI(st *lab.State, c kubernetes.Interface) error {
	ctx := context.Background()
	list, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, n := range st.Nodes {
		node, err := c.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cidr := netip.MustParsePrefix(node.Spec.PodCIDR)
		want := map[string]string{}
		labels := map[string]string{}
		for _, p := range list.Items {
			if p.Spec.NodeName != n.Name || p.Spec.HostNetwork || p.DeletionTimestamp != nil || p.Status.PodIP == "" {
				continue
			}
			want[p.Status.PodIP] = p.Namespace + "/" + p.Name
			labels[p.Status.PodIP] = p.Labels["app"]
		}
		s, err := n.Client().Status(ctx)
		if err != nil {
			return err
		}
		have := map[string]string{}
		for _, e := range s.Endpoints {
			if !cidr.Contains(e.Address) {
				return fmt.Errorf("%s: endpoint %v outside the node's pod CIDR %v", n.Name, e.Address, cidr)
			}
			have[e.Address.String()] = e.PodNamespace + "/" + e.PodName
			if l := labels[e.Address.String()]; l != "" && e.Labels["app"] != l {
				return fmt.Errorf("%s: endpoint %v has labels %v, pod has app=%s", n.Name, e.Address, e.Labels, l)
			}
		}
		if fmt.Sprint(have) != fmt.Sprint(want) {
			return fmt.Errorf("%s: agent leases %v, API has pods %v", n.Name, have, want)
		}
		if s.MapEntries != len(want) {
			return fmt.Errorf("%s: %d endpoint map entries for %d pods", n.Name, s.MapEntries, len(want))
		}
	}
	return nil
}

func podNS(t *testing.T, st *lab.State, p corev1.Pod) string {
	t.Helper()
	path, err := st.PodNetNS(netip.MustParseAddr(p.Status.PodIP))
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// echoBetween opens a TCP connection from client's namespace to an echo
// listener in server's namespace.
func echoBetween(t *testing.T, st *lab.State, client, server corev1.Pod) (net.Conn, func()) {
	t.Helper()
	ln := listenIn(t, podNS(t, st, server), ":9000")
	go serveEcho(ln)
	conn := dialIn(t, podNS(t, st, client), net.JoinHostPort(server.Status.PodIP, "9000"))
	return conn, func() { conn.Close(); ln.Close() }
}

// undisturbed runs disrupt while a connection from client to server is
// kept busy, and fails unless every echo came back and every node's
// endpoints and pod veths are exactly as before (adopted, not re-plumbed).
// It returns the echoes and the number of pod veths.
func undisturbed(t *testing.T, st *lab.State, client, server corev1.Pod, disrupt func()) (int, int) {
	t.Helper()
	conn, stopEcho := echoBetween(t, st, client, server)
	defer stopEcho()
	before := endpointsByNode(t, st)
	ifindexes := hostIfindexes(t, st)
	traffic := keepTalking(conn)
	disrupt()
	time.Sleep(time.Second) // and traffic still flows after it
	sent, err := traffic.stop()
	if err != nil {
		t.Fatalf("connection broke: %v", err)
	}
	if after := endpointsByNode(t, st); fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("endpoints changed:\n%v\n%v", before, after)
	}
	if got := hostIfindexes(t, st); fmt.Sprint(got) != fmt.Sprint(ifindexes) {
		t.Fatalf("pods were re-plumbed: host veths %v -> %v", ifindexes, got)
	}
	return sent, len(ifindexes)
}

// talker keeps one connection busy with echoed lines.
type talker struct {
	done chan struct{}
	res  chan talkResult
}

type talkResult struct {
	sent int
	err  error
}

func keepTalking(conn net.Conn) *talker {
	tk := &talker{done: make(chan struct{}), res: make(chan talkResult, 1)}
	go func() {
		r := bufio.NewReader(conn)
		for i := 0; ; i++ {
			select {
			case <-tk.done:
				tk.res <- talkResult{sent: i}
				return
			default:
			}
			conn.SetDeadline(time.Now().Add(2 * time.Second))
			msg := fmt.Sprintf("msg %d\n", i)
			if _, err := conn.Write([]byte(msg)); err != nil {
				tk.res <- talkResult{i, fmt.Errorf("write %d: %w", i, err)}
				return
			}
			if got, err := r.ReadString('\n'); err != nil || got != msg {
				tk.res <- talkResult{i, fmt.Errorf("echo %d: %q, %v", i, got, err)}
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return tk
}

func (tk *talker) stop() (int, error) {
	close(tk.done)
	r := <-tk.res
	return r.sent, r.err
}

// waitAgents waits until every node's agent answers again.
func waitAgents(t *testing.T, st *lab.State) {
	t.Helper()
	for _, n := range st.Nodes {
		waitFor(t, 30*time.Second, func() error { return n.Client().Health(context.Background()) })
	}
}

// hostIfindexes maps every pod veth of every node to its ifindex.
func hostIfindexes(t *testing.T, st *lab.State) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, n := range st.Nodes {
		err := lab.InNS(lab.NodeNSPath(n), func() error {
			links, err := netlink.LinkList()
			for _, l := range links {
				if datapath.IsHostIfName(l.Attrs().Name) {
					out[n.Name+"/"+l.Attrs().Name] = l.Attrs().Index
				}
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func waitFor(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// dumpFile logs the last lines of a file, for a failure's context.
func dumpFile(t *testing.T, path string, lines int) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	all := strings.Split(string(b), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	t.Logf("last %d lines of %s:\n%s", len(all), path, strings.Join(all, "\n"))
}

// flowsInclude checks that a node's agent holds an allowed and a denied
// flow of pod whose rules contain allowRule and denyRule.
func flowsInclude(ctx context.Context, st *lab.State, node, pod, allowRule, denyRule string) error {
	var sock string
	for _, n := range st.Nodes {
		if n.Name == node {
			sock = n.Socket
		}
	}
	var allowed, denied bool
	err := api.NewClient(sock).Flows(ctx, api.FlowsQuery{}, func(f api.Flow) error {
		if f.Pod != pod || f.Direction != "ingress" {
			return nil
		}
		allowed = allowed || (f.Verdict == "allowed" && strings.Contains(f.Rule, allowRule))
		denied = denied || (f.Verdict == "denied" && strings.Contains(f.Rule, denyRule))
		return nil
	})
	if err != nil {
		return err
	}
	if !allowed || !denied {
		return fmt.Errorf("flows of %s on %s: allowed by %q %v, denied by %q %v", pod, node, allowRule, allowed, denyRule, denied)
	}
	return nil
}

// flowsNameService checks that a node's agent holds a flow of pod with
// verdict (allowed; forwarded: from outside, to a backend on another
// node) through service, at an address ending in addr.
func flowsNameService(ctx context.Context, st *lab.State, node, pod, verdict, service, addr string) error {
	var sock string
	for _, n := range st.Nodes {
		if n.Name == node {
			sock = n.Socket
		}
	}
	var seen []string
	found := false
	err := api.NewClient(sock).Flows(ctx, api.FlowsQuery{FlowFilter: api.FlowFilter{Pod: pod, Service: service}}, func(f api.Flow) error {
		seen = append(seen, f.Verdict+" "+f.Direction+" "+f.Dst+" via "+f.ServiceAddr)
		found = found || (f.Verdict == verdict && f.Service == service && strings.HasSuffix(f.ServiceAddr, addr))
		return nil
	})
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("no %s flow of %s on %s through %s at *%s; its flows through it: %v", verdict, pod, node, service, addr, seen)
	}
	return nil
}

// TestKubernetesNativeNewPods runs the new-pod experiment on a cluster in
// native routing, where the sending node puts a fresh pod's identity into
// the packets that open its flows (bpf/lib/nativeid.h): the server's node
// judges it by that identity before its address arrives.
//
// Its cluster keeps kube-proxy (nftables), so the agents' mode beside
// kube-proxy runs end to end too.
func TestKubernetesNativeNewPods(t *testing.T) {
	st := newKubeLabConfig(t, lab.Config{Mode: datapath.ModeNative, KubeProxy: lab.KubeProxyNFTables})
	ctx := context.Background()
	c, err := st.Client()
	if err != nil {
		t.Fatal(err)
	}
	server := "apiVersion: v1\nkind: Pod\nmetadata: {name: web-native, labels: {app: web}}\n" +
		"spec:\n  nodeName: n1\n  terminationGracePeriodSeconds: 0\n" +
		"  containers: [{name: web, image: " + lab.AgnhostImage + ", imagePullPolicy: Never, args: [netexec, --http-port=8080]," +
		" readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}}]\n"
	if out, err := st.Kubectl(ctx, strings.NewReader(server), "apply", "-f", "-"); err != nil {
		t.Fatalf("apply: %v %s", err, out)
	}
	if out, err := st.Kubectl(ctx, nil, "wait", "--for=condition=Ready", "pod/web-native", "--timeout=120s"); err != nil {
		t.Fatalf("web-native: %v %s", err, out)
	}
	p, err := c.CoreV1().Pods("default").Get(ctx, "web-native", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	expectFreshPodsDenied(t, st, *p)
}

// expectFreshPodsDenied runs the new-pod experiment against server, a
// pod on n1 with the label app=web in namespace default: an Admin Deny of
// namespace newpods towards it, and fresh pods on n2 that connect the
// moment they start, before n1 can have learned their addresses through
// the API server. Their node vouches for their identity: the VNI in VXLAN
// mode, an IPv4 option in native routing. No connection may get through.
// A pod of another namespace, started the same way, connects all 3 times
// with a one-second timeout, which a dropped first SYN would miss: the
// probes are ones that succeed, and an allowed new pod waits for nothing.
func expectFreshPodsDenied(t *testing.T, st *lab.State, server corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	apply := func(yaml string) {
		t.Helper()
		if out, err := st.Kubectl(ctx, strings.NewReader(yaml), "apply", "-f", "-"); err != nil {
			t.Fatalf("apply: %v %s", err, out)
		}
	}
	defer st.Kubectl(ctx, nil, "delete", "namespace", "newpods", "oldpods", "--ignore-not-found", "--wait=false")
	defer st.Kubectl(ctx, nil, "delete", "clusternetworkpolicy", "deny-newpods", "--ignore-not-found")
	apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: newpods}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: oldpods}\n")
	apply("apiVersion: policy.networking.k8s.io/v1alpha2\nkind: ClusterNetworkPolicy\nmetadata: {name: deny-newpods}\n" +
		"spec:\n  tier: Admin\n  priority: 5\n" +
		"  subject: {pods: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: default}}, podSelector: {matchLabels: {app: web}}}}\n" +
		"  ingress: [{name: no-newpods, action: Deny, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: newpods}}}]}]\n")
	waitFor(t, 30*time.Second, func() error {
		out, err := st.Kubectl(ctx, nil, "get", "clusternetworkpolicy", "deny-newpods", "-o", "jsonpath={.status.conditions[?(@.type=='Programmed')].status}")
		if err != nil || strings.TrimSpace(string(out)) != "True" {
			return fmt.Errorf("deny-newpods not programmed: %v %s", err, out)
		}
		return nil
	})
	const fresh = 12
	pod := func(ns, name string) string {
		return "apiVersion: v1\nkind: Pod\nmetadata: {name: " + name + ", namespace: " + ns + "}\nspec:\n" +
			"  nodeName: n2\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n" +
			"  containers:\n  - name: c\n    image: " + lab.AgnhostImage + "\n    imagePullPolicy: Never\n" +
			"    command: [sh, -c, 'for i in 1 2 3; do /agnhost connect " + server.Status.PodIP + ":8080 --timeout=1s && echo REACHED; done; true']\n---\n"
	}
	var all strings.Builder
	for i := 0; i < fresh; i++ {
		all.WriteString(pod("newpods", fmt.Sprintf("fresh-%d", i)))
	}
	all.WriteString(pod("oldpods", "control"))
	apply(all.String())
	waitFor(t, 90*time.Second, func() error {
		out, err := st.Kubectl(ctx, nil, "get", "pods", "-n", "newpods", "-o", "jsonpath={.items[*].status.phase}")
		if err != nil || strings.Count(string(out), "Succeeded") != fresh {
			return fmt.Errorf("fresh pods: %v %s", err, out)
		}
		out, err = st.Kubectl(ctx, nil, "get", "pod", "-n", "oldpods", "control", "-o", "jsonpath={.status.phase}")
		if err != nil || string(out) != "Succeeded" {
			return fmt.Errorf("control pod: %v %s", err, out)
		}
		return nil
	})
	reached := 0
	for i := 0; i < fresh; i++ {
		out, err := st.Kubectl(ctx, nil, "logs", "-n", "newpods", fmt.Sprintf("fresh-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		reached += strings.Count(string(out), "REACHED")
	}
	if reached != 0 {
		t.Errorf("%d connections of %d fresh pods in namespace newpods got through an Admin Deny", reached, fresh)
	}
	out, err := st.Kubectl(ctx, nil, "logs", "-n", "oldpods", "control")
	if got := strings.Count(string(out), "REACHED"); err != nil || got != 3 {
		t.Errorf("control pod in namespace oldpods: %v %q: %d connections of 3", err, out, got)
	}
}

// checkConformance fails t for a conformance run that could not run or
// failed a case, naming each failure and showing the end of the suite's
// log, and logs the counts of one that passed.
func checkConformance(t *testing.T, res conformance.Result, err error, logPath string) {
	t.Helper()
	if err != nil {
		dumpFile(t, logPath, 200)
		t.Fatal(err)
	}
	t.Logf("%s in %.0f s", res, res.Seconds)
	for _, f := range res.Failed {
		t.Errorf("%s: FAILED %s", res.Suite, f)
	}
	if len(res.Failed) > 0 {
		dumpFile(t, logPath, 200)
	}
}

// waitHTTPRecords waits up to 5 s until see, run over the HTTP records
// of pod at node, has marked n things seen; want says what they are.
func waitHTTPRecords(t *testing.T, ctx context.Context, st *lab.State, node, pod string, n int, want string, see func(f api.Flow, seen map[string]bool)) {
	t.Helper()
	waitFor(t, 5*time.Second, func() error {
		seen, err := httpRecords(ctx, st, node, pod, see)
		if err != nil {
			return err
		}
		if len(seen) != n {
			return fmt.Errorf("records of %s: %v, want %s", pod, seen, want)
		}
		return nil
	})
}

// httpRecords reads the HTTP request records of pod at node's agent and
// lets see mark in a set what it recognises of each.
func httpRecords(ctx context.Context, st *lab.State, node, pod string, see func(f api.Flow, seen map[string]bool)) (map[string]bool, error) {
	var sock string
	for _, n := range st.Nodes {
		if n.Name == node {
			sock = n.Socket
		}
	}
	seen := map[string]bool{}
	err := api.NewClient(sock).Flows(ctx, api.FlowsQuery{FlowFilter: api.FlowFilter{Pod: pod, HTTP: true}}, func(f api.Flow) error {
		see(f, seen)
		return nil
	})
	return seen, err
}

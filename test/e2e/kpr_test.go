package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/cli"
	"github.com/weirnet/weir/internal/cni"
	"github.com/weirnet/weir/internal/conformance"
	"github.com/weirnet/weir/internal/connectivity"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/lab"
	"github.com/weirnet/weir/internal/version"
)

// kprManifest is one agnhost netexec pod on n2 with a hostPort, a NodePort
// Service in front of it with each external traffic policy, and a client
// pod on n1.
const kprManifest = `
apiVersion: v1
kind: Namespace
metadata: {name: kpr}
---
apiVersion: v1
kind: Pod
metadata: {name: echo, namespace: kpr, labels: {app: echo}}
spec:
  nodeName: n2
  terminationGracePeriodSeconds: 0
  containers:
  - name: echo
    image: ` + lab.AgnhostImage + `
    imagePullPolicy: Never
    args: [netexec, --http-port=8080]
    ports: [{containerPort: 8080, hostPort: 31900}]
    readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: kpr}
spec:
  nodeName: n1
  terminationGracePeriodSeconds: 0
  containers:
  - {name: c, image: ` + lab.AgnhostImage + `, imagePullPolicy: Never, args: [pause]}
---
apiVersion: v1
kind: Service
metadata: {name: cluster, namespace: kpr}
spec:
  type: NodePort
  selector: {app: echo}
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30777}]
---
apiVersion: v1
kind: Service
metadata: {name: local, namespace: kpr}
spec:
  type: NodePort
  externalTrafficPolicy: Local
  selector: {app: echo}
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30778}]
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: kpr}
spec:
  selector: {app: nobody}
  ports: [{name: http, port: 80, targetPort: 8080}]
`

// TestKubernetesWithoutKubeProxy runs the cluster with no kube-proxy, the
// agents replacing it, and checks what a user sees: a pod reaches a
// Service by DNS name (CoreDNS itself through a ClusterIP); a host outside
// the cluster reaches a NodePort at the node without the backend (through
// it, the reply coming back that way) and at the node with it (its own
// address kept); externalTrafficPolicy: Local answers only where the
// endpoint is and drops elsewhere; a pod's hostPort answers from outside;
// a Service without endpoints refuses at once.
func TestKubernetesWithoutKubeProxy(t *testing.T) {
	st := newKubeLabConfig(t, lab.Config{KubeProxy: lab.KubeProxyNone})
	ctx := context.Background()
	for _, p := range st.Kube.Procs {
		if strings.HasSuffix(p.Name, "/kube-proxy") {
			t.Fatalf("the lab runs %s", p.Name)
		}
	}
	if out, err := st.Kubectl(ctx, strings.NewReader(kprManifest), "apply", "-f", "-"); err != nil {
		t.Fatalf("apply: %v %s", err, out)
	}
	if out, err := st.Kubectl(ctx, nil, "-n", "kpr", "wait", "--for=condition=Ready", "pod/echo", "pod/client", "--timeout=120s"); err != nil {
		t.Fatalf("pods: %v %s", err, out)
	}
	// The pod reaches the Service by name: CoreDNS answers through the
	// kube-dns ClusterIP, and the Service's ClusterIP is translated at
	// the socket.
	waitFor(t, 30*time.Second, func() error {
		out, err := st.Kubectl(ctx, nil, "-n", "kpr", "exec", "client", "--", "/agnhost", "connect", "cluster.kpr.svc.cluster.local:80", "--timeout=3s")
		if err != nil {
			return fmt.Errorf("client to cluster.kpr by name: %v %s", err, out)
		}
		return nil
	})
	out, err := st.Kubectl(ctx, nil, "-n", "kpr", "exec", "client", "--", "/agnhost", "connect", "empty.kpr.svc.cluster.local:80", "--timeout=3s")
	if err == nil || !strings.Contains(string(out), "REFUSED") {
		t.Errorf("a Service without endpoints: %v %s, want REFUSED at once", err, out)
	}

	ext, err := ns.GetNS("/var/run/netns/" + st.ExtHost)
	if err != nil {
		t.Fatal(err)
	}
	defer ext.Close()
	// get fetches url from the outside host. The connection is made on
	// the thread ns.Do holds in that namespace (an http.Transport would
	// dial from another goroutine, in whatever namespace its thread is).
	get := func(url string) (string, error) {
		hostPort, path, _ := strings.Cut(strings.TrimPrefix(url, "http://"), "/")
		var body string
		err := ext.Do(func(ns.NetNS) error {
			c, err := net.DialTimeout("tcp4", hostPort, 2*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(3 * time.Second))
			fmt.Fprintf(c, "GET /%s HTTP/1.0\r\nHost: %s\r\n\r\n", path, hostPort)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s", url, resp.Status)
			}
			body = string(b)
			return err
		})
		return body, err
	}
	extIP := st.ExtIP.String()
	n1, n2 := st.Nodes[0].IP.String(), st.Nodes[1].IP.String()
	for _, c := range []struct {
		name, url, from string // from: the client address the backend sees
	}{
		{"NodePort at the node without the backend", "http://" + n1 + ":30777/clientip", n1},
		{"NodePort at the node with the backend", "http://" + n2 + ":30777/clientip", extIP},
		{"externalTrafficPolicy: Local where the endpoint is", "http://" + n2 + ":30778/clientip", extIP},
		{"hostPort", "http://" + n2 + ":31900/clientip", extIP},
	} {
		var body string
		waitFor(t, 20*time.Second, func() (err error) {
			body, err = get(c.url)
			return err
		})
		if host, _, _ := net.SplitHostPort(strings.TrimSpace(body)); host != c.from {
			t.Errorf("%s: the backend saw %q, want %s", c.name, body, c.from)
		}
	}
	// Flow records name the Service each connection went through: the
	// client pod's on n1 by its socket (the ClusterIP it connected to by
	// name), the outside host's on n2, where the backend is, by the
	// NodePort translation; the outside host's through n1's NodePort on
	// n1, which forwarded it to n2 (n2 sees n1's address).
	waitFor(t, 10*time.Second, func() error {
		return errors.Join(
			flowsNameService(ctx, st, "n1", "kpr/client", "allowed", "kpr/cluster", ":80"),
			flowsNameService(ctx, st, "n2", "kpr/echo", "allowed", "kpr/cluster", n2+":30777"),
			flowsNameService(ctx, st, "n2", "kpr/echo", "allowed", "kpr/local", n2+":30778"),
			flowsNameService(ctx, st, "n1", "kpr/echo", "forwarded", "kpr/cluster", n1+":30777"))
	})
	// The agents the chart installed report the build this tree is.
	for _, n := range st.Nodes {
		v, err := api.NewClient(n.Socket).Version(ctx)
		if err != nil || v.Version != version.Version || v.Platform == "" {
			t.Errorf("%s: agent version %+v, %v; want %s", n.Name, v, err, version.Version)
		}
	}
	if body, err := get("http://" + n1 + ":30778/clientip"); err == nil {
		t.Errorf("externalTrafficPolicy: Local at the node without the endpoint answered %q, want a drop", body)
	} else if !os.IsTimeout(err) && !strings.Contains(err.Error(), "timeout") {
		t.Errorf("externalTrafficPolicy: Local at the node without the endpoint: %v, want a timeout (dropped)", err)
	}

	t.Run("weir connectivity test and weir status reach the cluster through its API server alone", func(t *testing.T) {
		connectivityTest(t, st, ext)
	})

	t.Run("Services conformance: fast subset of the upstream sig-network suite", func(t *testing.T) {
		tools, err := conformance.ServicesSuite(ctx, testWriter{t})
		if err != nil {
			t.Fatal(err)
		}
		results := t.TempDir()
		res, err := conformance.RunServices(ctx, st, tools, true, 4, results, testWriter{t})
		checkConformance(t, res, err, filepath.Join(results, "services.log"))
		if res.KubeProxy != lab.KubeProxyNone {
			t.Errorf("the suite ran with kube-proxy %q, want none", res.KubeProxy)
		}
	})

	// Last: it takes the cluster's networking away.
	t.Run("weir uninstall, then helm uninstall, leave nothing of Weir on the nodes", func(t *testing.T) {
		uninstallLeavesNothing(t, st)
	})
}

// connectivityTest runs `weir connectivity test` against the lab as
// against any cluster (its kubeconfig, no lab socket), with a TCP
// listener on the outside host as the external target, and wants every
// check to pass with the deciding rule of each denial named from the
// agents' flows; then `weir status` reads both agents through their pods.
func connectivityTest(t *testing.T, st *lab.State, ext ns.NetNS) {
	var ln net.Listener
	if err := ext.Do(func(ns.NetNS) (err error) {
		ln, err = net.Listen("tcp4", net.JoinHostPort(st.ExtIP.String(), "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	weir := filepath.Join(binDir, "weir")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, weir, "connectivity", "test", "--kubeconfig", st.Kube.Kubeconfig,
		"--external-target", ln.Addr().String(), "-o", "json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var rep connectivity.Report
	if jerr := json.Unmarshal(out, &rep); jerr != nil {
		t.Fatalf("weir connectivity test: %v (%v): %s %s", err, jerr, out, stderr.String())
	}
	for _, c := range rep.Checks {
		t.Logf("%-5v %-22s %-62s %-10s %s | %s", c.Pass, c.Phase, c.Name, c.Got, c.Rule, c.Detail)
	}
	if err != nil {
		t.Fatalf("weir connectivity test: %v: %s", err, stderr.String())
	}
	if rep.Failed != 0 || rep.Skipped != 0 || rep.Passed < 24 || rep.Cleanup != "" {
		t.Errorf("%d passed, %d failed, %d skipped, cleanup %q; want at least 24 passed and nothing else", rep.Passed, rep.Failed, rep.Skipped, rep.Cleanup)
	}
	for _, c := range rep.Checks {
		if c.Want == connectivity.WantDenied && !strings.HasPrefix(c.Rule, "denied: ") {
			t.Errorf("%s: rule %q, want the denying flow's", c.Name, c.Rule)
		}
	}
	if out, err := st.Kubectl(ctx, nil, "get", "namespace", connectivity.DefaultNamespace, "--ignore-not-found", "-o", "name"); err != nil || len(strings.TrimSpace(string(out))) != 0 {
		t.Errorf("the test's namespace is left: %v %s", err, out)
	}

	// weir status with only the kubeconfig: both nodes' agents answer
	// through their pods, and a node without an agent pod would be named.
	status, err := exec.CommandContext(ctx, weir, "status", "--kubeconfig", st.Kube.Kubeconfig).CombinedOutput()
	if err != nil {
		t.Fatalf("weir status --kubeconfig: %v: %s", err, status)
	}
	for _, n := range st.Nodes {
		if !strings.Contains(string(status), "node "+n.Name+":") {
			t.Errorf("weir status --kubeconfig does not show node %s:\n%s", n.Name, status)
		}
	}
	// weir version, through the pods too, and with --lab the plugin the
	// DaemonSet installed on the lab's node.
	for _, args := range [][]string{{"--kubeconfig", st.Kube.Kubeconfig}, {"--lab", st.Config.Name}} {
		out, err := exec.CommandContext(ctx, weir, append([]string{"version", "-o", "json"}, args...)...).Output()
		var v cli.Versions
		if err != nil || json.Unmarshal(out, &v) != nil {
			t.Errorf("weir version %v: %v %s", args, err, out)
			continue
		}
		for _, a := range v.Agents {
			if a.Info == nil || a.Info.Version != version.Version {
				t.Errorf("weir version %v: agent %s %+v, want %s", args, a.Node, a, version.Version)
			}
		}
		if len(v.Agents) != len(st.Nodes) {
			t.Errorf("weir version %v: %d agents, want %d", args, len(v.Agents), len(st.Nodes))
		}
		if args[0] == "--lab" && (v.CNI.Info == nil || v.CNI.Info.Version != version.Version) {
			t.Errorf("weir version --lab: CNI plugin %+v, want %s", v.CNI, version.Version)
		}
	}
}

// uninstallLeavesNothing runs weir uninstall and helm uninstall and looks
// on every node for anything of Weir: its agent pods, pod veths, overlay
// device, routes, masquerade table, programs attached to any device, pins,
// CNI config and plugin, state and socket; and for any of its programs
// still loaded on the machine (the lab is the only Weir here).
func uninstallLeavesNothing(t *testing.T, st *lab.State) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Another CNI's config the agents set aside comes back.
	for _, n := range st.Nodes {
		conf, _ := st.CNIDirs(&n)
		if err := os.WriteFile(filepath.Join(conf, "00-previous.conflist"+cni.SetAsideSuffix), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "weir"), "uninstall", "--kubeconfig", st.Kube.Kubeconfig).CombinedOutput()
	t.Logf("weir uninstall:\n%s", out)
	if err != nil {
		t.Fatalf("weir uninstall: %v", err)
	}
	if out, err := st.Helm(ctx, "uninstall", lab.HelmRelease, "--namespace", "kube-system", "--wait"); err != nil {
		t.Fatalf("helm uninstall: %v %s", err, out)
	}
	for _, sel := range []string{"app.kubernetes.io/name=weir-agent", "weir.io/uninstall=true"} {
		if out, err := st.Kubectl(ctx, nil, "get", "pods,daemonsets,jobs", "-A", "-l", sel, "-o", "name"); err != nil || len(bytes.TrimSpace(out)) != 0 {
			t.Errorf("objects labelled %s left: %v %s", sel, err, out)
		}
	}
	for _, n := range st.Nodes {
		conf, bin := st.CNIDirs(&n)
		if _, err := os.Stat(filepath.Join(conf, "00-previous.conflist")); err != nil {
			t.Errorf("node %s: the set-aside config of another CNI was not given back: %v", n.Name, err)
		}
		for _, p := range []string{n.PinDir, n.StateDir, n.Socket, filepath.Join(conf, cni.ConfListName), filepath.Join(bin, "weir-cni"),
			filepath.Join(conf, "00-previous.conflist"+cni.SetAsideSuffix)} {
			if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("node %s: %s left (%v)", n.Name, p, err)
			}
		}
		left, err := weirInNetNS(filepath.Join("/var/run/netns", n.NetNS))
		if err != nil {
			t.Fatalf("node %s: %v", n.Name, err)
		}
		if len(left) > 0 {
			t.Errorf("node %s: left in its network namespace: %v", n.Name, left)
		}
	}
	// mount-fs's cgroup2 mounts reached the machine; the uninstall Job's
	// unmounts must have too.
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err != nil {
		t.Fatal(err)
	} else {
		for _, l := range strings.Split(string(mi), "\n") {
			if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], st.RunDir+"/") && strings.Contains(l, " - cgroup2 ") {
				t.Errorf("a cgroup2 mount of Weir's is left on the machine: %s", l)
			}
		}
	}
	// The kernel frees a program after its last link is released, a
	// moment after the pins went (an RCU grace period, then a work
	// queue), and this process's earlier labs' programs the same way; one
	// still loaded a minute later is held by something.
	released := time.Now()
	waitFor(t, time.Minute, func() error {
		loaded, err := datapath.ProgramStats(append(append([]string{}, datapath.ProgramNames...), datapath.SocketProgramNames...))
		if err == nil && len(loaded) > 0 {
			err = fmt.Errorf("Weir's programs still loaded: %v", loaded)
		}
		return err
	})
	t.Logf("no Weir program loaded on the machine %v after the check began", time.Since(released).Round(100*time.Millisecond))

	// Installed again, as an operator going back would: the agents come
	// up on the cleaned nodes (and the lab's pods can be torn down
	// through their CNI).
	if err := st.InstallWeir(ctx); err != nil {
		t.Fatalf("reinstall: %v", err)
	}
	if out, err := st.Kubectl(ctx, nil, "-n", "kube-system", "rollout", "status", "daemonset/weir-agent", "--timeout=180s"); err != nil {
		t.Fatalf("agents after reinstalling: %v %s", err, out)
	}
	for _, n := range st.Nodes {
		waitFor(t, 60*time.Second, func() error { return api.NewClient(n.Socket).Health(ctx) })
	}
}

// weirInNetNS lists what of Weir a node's network namespace holds.
func weirInNetNS(path string) ([]string, error) {
	nsh, err := ns.GetNS(path)
	if err != nil {
		return nil, err
	}
	defer nsh.Close()
	var left []string
	err = nsh.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			name := l.Attrs().Name
			if name == datapath.OverlayDevice || datapath.IsHostIfName(name) {
				left = append(left, "link "+name)
			}
			for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
				res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: at})
				if err == nil && len(res.Programs) > 0 {
					left = append(left, fmt.Sprintf("%d tcx programs on %s", len(res.Programs), name))
				}
			}
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: 0xe8}, netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			return err
		}
		for _, r := range routes {
			left = append(left, "route "+r.Dst.String())
		}
		c, err := nftables.New()
		if err != nil {
			return err
		}
		defer c.CloseLasting()
		tables, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
		if err != nil {
			return err
		}
		for _, tb := range tables {
			if tb.Name == "weir" {
				left = append(left, "nftables table ip weir")
			}
		}
		return nil
	})
	return left, err
}

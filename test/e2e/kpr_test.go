package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/conformance"
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
}

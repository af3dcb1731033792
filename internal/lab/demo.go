package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/weirnet/weir/internal/lab"
)

// webHTTPPolicy restricts the web pods' http port, for their own tier,
// to GET /hostname, GET /echo... with Host web.allowed, and PUT
// /hostname with X-Role: admin and an X-Trace header.
const webHTTPPolicy = `apiVersion: weir.io/v1alpha1
kind: WeirNetworkPolicy
metadata: {name: web-http, namespace: default}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {tier: backend}}}]
    ports:
    - port: http
      http:
      - {method: GET, path: {type: Exact, value: /hostname}}
      - {method: GET, path: {type: PathPrefix, value: /echo}, hostnames: [web.allowed]}
      - method: PUT
        path: {type: Exact, value: /hostname}
        headers: [{name: X-Role, type: Exact, value: admin}, {name: X-Trace, type: Present}]
      - {method: POST, path: {type: RegularExpression, value: "/ec+ho"}}
`

// webTierPolicy: Admin rules on the web pods' http port with HTTP rules
// (conditional rules), in order: paths under /shell are denied whatever
// follows, GET /hostname accepted, and everything else denied by a rule
// without HTTP rules.
const webTierPolicy = `apiVersion: weir.io/v1alpha1
kind: WeirClusterNetworkPolicy
metadata: {name: web-http-tiers}
spec:
  tier: Admin
  priority: 5
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: web}}}}
  ingress:
  - name: no-shell
    action: Deny
    from: [{namespaces: {}}]
    protocols: [{tcp: {destinationPort: {number: 8080}}}]
    http: [{path: {type: PathPrefix, value: /shell}}]
  - name: hostname
    action: Accept
    from: [{namespaces: {}}]
    protocols: [{tcp: {destinationPort: {number: 8080}}}]
    http: [{method: GET, path: {type: Exact, value: /hostname}}]
  - name: rest
    action: Deny
    from: [{namespaces: {}}]
    protocols: [{tcp: {destinationPort: {number: 8080}}}]
`

// egressHTTPPolicy restricts what pods labelled weir-e2e=egress-http
// send to the web pods' http port to GET /hostname: judged on the
// client's socket, at the client's node. Nothing else may leave them.
const egressHTTPPolicy = `apiVersion: weir.io/v1alpha1
kind: WeirNetworkPolicy
metadata: {name: client-egress-http, namespace: default}
spec:
  podSelector: {matchLabels: {weir-e2e: egress-http}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {app: web}}}]
    ports:
    - port: 8080
      http:
      - {method: GET, path: {type: Exact, value: /hostname}}
      - method: GET
        path: {type: Exact, value: /echo}
        headers: [{name: X-Team, type: RegularExpression, value: "blu+e"}]
`

// restrictEgress labels client weir-e2e=label and applies yaml, a
// WeirNetworkPolicy named name selecting that label; the returned func
// deletes the policy and the label.
func restrictEgress(t *testing.T, ctx context.Context, st *lab.State, client corev1.Pod, label, name, yaml string) func() {
	t.Helper()
	if out, err := st.Kubectl(ctx, nil, "label", "pod", client.Name, "weir-e2e="+label, "--overwrite"); err != nil {
		t.Fatalf("label %s: %v %s", client.Name, err, out)
	}
	if out, err := st.Kubectl(ctx, strings.NewReader(yaml), "apply", "-f", "-"); err != nil {
		t.Fatalf("apply %s: %v %s", name, err, out)
	}
	return func() {
		for _, args := range [][]string{
			{"delete", "weirnetworkpolicies.weir.io", name, "--ignore-not-found"},
			{"label", "pod", client.Name, "weir-e2e-"},
		} {
			if out, err := st.Kubectl(ctx, nil, args...); err != nil {
				t.Errorf("kubectl %v: %v %s", args, err, out)
			}
		}
	}
}

// applyWebHTTPPolicy applies webHTTPPolicy and waits until client's
// POST to base's /hostname is answered 403; the returned func deletes it
// and waits until the POST is served again.
func applyWebHTTPPolicy(t *testing.T, ctx context.Context, st *lab.State, client corev1.Pod, base string) func() {
	t.Helper()
	if out, err := st.Kubectl(ctx, strings.NewReader(webHTTPPolicy), "apply", "-f", "-"); err != nil {
		t.Fatalf("apply web-http: %v %s", err, out)
	}
	waitFor(t, 15*time.Second, func() error {
		if got := curlFrom(ctx, st, client, "-X", "POST", base+"/hostname"); len(got) < 1 || got[0] != "403" {
			return fmt.Errorf("POST /hostname: %v, want 403 once the policy is loaded", got)
		}
		return nil
	})
	return func() {
		if out, err := st.Kubectl(ctx, nil, "delete", "weirnetworkpolicies.weir.io", "web-http", "--ignore-not-found"); err != nil {
			t.Errorf("delete web-http: %v %s", err, out)
		}
		waitFor(t, 15*time.Second, func() error {
			if got := curlFrom(ctx, st, client, "-X", "POST", base+"/hostname"); len(got) < 1 || got[0] != "200" {
				return fmt.Errorf("POST /hostname after the policy's deletion: %v, want 200", got)
			}
			return nil
		})
	}
}

// curlFrom runs curl in pod p and returns "<status> <connections
// opened>" for each URL, flattened: curl reuses its connection for the
// next URL when it can.
func curlFrom(ctx context.Context, st *lab.State, p corev1.Pod, args ...string) []string {
	cmd := append([]string{"exec", p.Name, "--", "curl", "-sS", "-m", "5", "-o", "/dev/null", "-w", "%{http_code} %{num_connects}\n"}, args...)
	out, _ := st.Kubectl(ctx, nil, cmd...)
	return strings.Fields(string(out))
}

// deniedLoad sends a request the policy denies (POST /hostname) on a new
// connection every 50 ms from a pod's network namespace, and counts how
// each was answered.
type deniedLoad struct {
	nsPath, addr string
	done         chan struct{}
	stopOnce     sync.Once
	wg           sync.WaitGroup

	mu  sync.Mutex
	res deniedLoadResult
}

// deniedLoadResult: Denied were answered 403, Passed reached the server
// (any other status from it), Failed got no answer (Err the first).
type deniedLoadResult struct {
	Denied, Passed, Failed int
	Err                    error
}

func startDeniedLoad(nsPath, addr string) *deniedLoad {
	l := &deniedLoad{nsPath: nsPath, addr: addr, done: make(chan struct{})}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		every50ms(l.done, func() {
			status, err := l.post()
			l.mu.Lock()
			switch {
			case err != nil:
				l.res.Failed++
				if l.res.Err == nil {
					l.res.Err = err
				}
			case status == http.StatusForbidden:
				l.res.Denied++
			default:
				l.res.Passed++
			}
			l.mu.Unlock()
		})
	}()
	return l
}

func (l *deniedLoad) post() (int, error) {
	return lab.HTTPStatusIn(l.nsPath, l.addr, "POST /hostname HTTP/1.1\r\nHost: web\r\nContent-Length: 0\r\n\r\n")
}

// stop ends the loop and returns what it saw; it may be called again.
func (l *deniedLoad) stop() deniedLoadResult {
	l.stopOnce.Do(func() { close(l.done) })
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.res
}

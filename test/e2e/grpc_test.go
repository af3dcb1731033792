package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"golang.org/x/net/http2"
	corev1 "k8s.io/api/core/v1"

	"github.com/weirnet/weir/internal/lab"
)

// grpcServerPod is a real gRPC server (grpc-go, agnhost's health
// checking endpoint) on n2, speaking HTTP/2 over cleartext on port 5000.
const grpcServerPod = `apiVersion: v1
kind: Pod
metadata: {name: grpc-server, labels: {app: grpc}}
spec:
  nodeName: n2
  terminationGracePeriodSeconds: 0
  containers:
  - name: grpc
    image: ` + lab.AgnhostImage + `
    imagePullPolicy: Never
    args: [grpc-health-checking, --port=5000, --http-port=8081]
    readinessProbe: {tcpSocket: {port: 5000}, periodSeconds: 1}
`

// grpcHTTPPolicy lets the web pods call one method of the gRPC server's
// health service: a gRPC call is POST /package.Service/Method.
const grpcHTTPPolicy = `apiVersion: weir.io/v1alpha1
kind: WeirNetworkPolicy
metadata: {name: grpc-http, namespace: default}
spec:
  podSelector: {matchLabels: {app: grpc}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {app: web}}}]
    ports:
    - port: 5000
      http:
      - {method: POST, path: {type: Exact, value: /grpc.health.v1.Health/Check}}
`

// grpcEgressPolicy lets a client labelled weir-e2e=egress-grpc call one
// method of the gRPC server's health service and nothing else: judged on
// the client's side.
const grpcEgressPolicy = `apiVersion: weir.io/v1alpha1
kind: WeirNetworkPolicy
metadata: {name: grpc-egress, namespace: default}
spec:
  podSelector: {matchLabels: {weir-e2e: egress-grpc}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {app: grpc}}}]
    ports:
    - port: 5000
      http:
      - {method: POST, path: {type: Exact, value: /grpc.health.v1.Health/Check}}
`

// grpcCall makes a gRPC call (an empty request message) to each URL from
// pod p with curl over HTTP/2 with prior knowledge, as gRPC clients
// connect, and returns "<status> <HTTP version> <connections opened>" for
// each, flattened. (curl 7.88 cannot reuse an h2c connection for a second
// URL, with or without Weir: grpcOneConn keeps one.)
func grpcCall(ctx context.Context, st *lab.State, p corev1.Pod, urls ...string) string {
	script := `printf '\0\0\0\0\0' | curl -sS -m 5 --http2-prior-knowledge -H 'content-type: application/grpc' -H 'te: trailers' --data-binary @-`
	for _, u := range urls {
		script += " -o /dev/null -w '%{http_code} %{http_version} %{num_connects}\\n' " + u
	}
	out, _ := st.Kubectl(ctx, nil, "exec", p.Name, "--", "bash", "-c", script)
	return strings.Join(strings.Fields(string(out)), " ")
}

// grpcOneConn makes gRPC calls to the health service at addr (an empty
// request message each) on one HTTP/2 connection opened from pod p's
// network namespace, one after another, and returns "<status>
// <grpc-status>" for each ("-" for none), flattened. A broken connection
// fails the test.
func grpcOneConn(t *testing.T, st *lab.State, p corev1.Pod, addr string, methods ...string) string {
	t.Helper()
	conn := dialIn(t, podNS(t, st, p), addr)
	defer conn.Close()
	cc, err := (&http2.Transport{AllowHTTP: true}).NewClientConn(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	var out []string
	for _, m := range methods {
		req, err := http.NewRequestWithContext(context.Background(), "POST", "http://"+addr+"/grpc.health.v1.Health/"+m, bytes.NewReader(make([]byte, 5)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("Te", "trailers")
		res, err := cc.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s on the kept connection: %v", m, err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		grpcStatus := res.Trailer.Get("Grpc-Status")
		if grpcStatus == "" {
			grpcStatus = res.Header.Get("Grpc-Status") // a trailers-only answer
		}
		if grpcStatus == "" {
			grpcStatus = "-"
		}
		out = append(out, fmt.Sprintf("%d %s", res.StatusCode, grpcStatus))
	}
	return strings.Join(out, " ")
}

package cnp

import (
	"bytes"
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/fstest"

	"sigs.k8s.io/network-policy-api/conformance"
)

const baseFixture = `apiVersion: v1
kind: Namespace
metadata:
  name: ns-a
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
  namespace: ns-a
spec:
  template:
    spec:
      containers:
        - name: client
          image: agnhost
        - name: tcp-{{ index .HostNetworkPorts 0 }}
          image: agnhost
          ports:
            - containerPort: {{ index .HostNetworkPorts 0 }}
        - name: sctp-{{ index .HostNetworkPorts 1 }}
          image: agnhost
          env:
          - name: SERVE_SCTP_PORT_{{ index .HostNetworkPorts 1 }}
            value: "foo"
        - name: other-env
          image: agnhost
          env:
          - name: HOST_IP
            value: "x"
`

func TestBaseWithoutSCTP(t *testing.T) {
	fsys := fstest.MapFS{"base.yaml": {Data: []byte(baseFixture)}}
	got, err := BaseWithoutSCTP(fsys, "base.yaml", []int{7000, 7001})
	if err != nil {
		t.Fatal(err)
	}
	s := string(got)
	for _, want := range []string{"name: ns-a", "name: client", "name: tcp-7000", "containerPort: 7000", "name: other-env", "name: HOST_IP"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	for _, gone := range []string{"sctp-7001", "SERVE_SCTP_PORT", "{{"} {
		if strings.Contains(s, gone) {
			t.Errorf("output still has %q:\n%s", gone, s)
		}
	}
	if n := strings.Count(s, "---\n"); n != 2 {
		t.Errorf("%d documents, want 2", n)
	}
}

func TestBaseWithoutSCTPMissingPort(t *testing.T) {
	fsys := fstest.MapFS{"base.yaml": {Data: []byte(baseFixture)}}
	if _, err := BaseWithoutSCTP(fsys, "base.yaml", []int{7000}); err == nil {
		t.Fatal("rendered with too few host-network ports")
	}
}

// The suite's own base manifests: every workload keeps its pods' other
// servers, and no SCTP server is left.
func TestBaseWithoutSCTPUpstream(t *testing.T) {
	ports := []int{34345, 34346, 34347, 34348, 34349, 34350, 34351, 34352}
	got, err := BaseWithoutSCTP(conformance.Manifests, "base/manifests.yaml", ports)
	if err != nil {
		t.Fatal(err)
	}
	orig, err := conformance.Manifests.ReadFile("base/manifests.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(orig, []byte(sctpEnvPrefix)) {
		t.Fatal("upstream base manifests serve no SCTP any more: BaseWithoutSCTP is not needed")
	}
	s := string(got)
	if strings.Contains(s, sctpEnvPrefix) {
		t.Errorf("SCTP servers left:\n%s", s)
	}
	for _, want := range []string{"harry-potter-80", "luna-lovegood-53", "centaur-34345-tcp", "centaur-34347-udp", "kind: Namespace"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func TestServeManifest(t *testing.T) {
	saved := http.DefaultClient.Transport
	t.Cleanup(func() { http.DefaultClient.Transport = saved })
	url, stop := ServeManifest([]byte("kind: Namespace\n"))
	defer stop()
	if !strings.HasPrefix(url, "https://127.0.0.1:") {
		t.Fatalf("URL %s is not a loopback HTTPS URL", url)
	}
	resp, err := http.DefaultClient.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || string(b) != "kind: Namespace\n" {
		t.Fatalf("got %q, %v", b, err)
	}
	// Only the client ServeManifest configured trusts the server.
	other := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{}}}
	if _, err := other.Get(url); err == nil {
		t.Error("an ordinary client trusted the test certificate")
	}
}

package cnp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strings"
	"text/template"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// sctpEnvPrefix marks a container as an SCTP server: agnhost porter serves
// SCTP on every port named by such a variable.
const sctpEnvPrefix = "SERVE_SCTP_PORT_"

// BaseWithoutSCTP returns the base manifests at path in fsys rendered for
// the given host-network ports, as the suite renders them, with every
// container that serves SCTP removed. The result holds no template
// actions, so the suite rendering it again changes nothing.
func BaseWithoutSCTP(fsys fs.FS, path string, hostNetworkPorts []int) ([]byte, error) {
	src, err := fs.ReadFile(fsys, path)
	if err != nil {
		return nil, fmt.Errorf("read base manifests: %w", err)
	}
	tmpl, err := template.New(path).Option("missingkey=error").Parse(string(src))
	if err != nil {
		return nil, fmt.Errorf("parse base manifests %s: %w", path, err)
	}
	var rendered bytes.Buffer
	if err := tmpl.Execute(&rendered, struct{ HostNetworkPorts []int }{hostNetworkPorts}); err != nil {
		return nil, fmt.Errorf("render base manifests %s: %w", path, err)
	}
	dec := k8syaml.NewYAMLOrJSONDecoder(&rendered, 4096)
	var out bytes.Buffer
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("decode base manifests %s: %w", path, err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		if err := dropSCTPServers(&obj); err != nil {
			return nil, err
		}
		b, err := yaml.Marshal(obj.Object)
		if err != nil {
			return nil, fmt.Errorf("encode %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
		out.WriteString("---\n")
		out.Write(b)
	}
	if strings.Contains(out.String(), "{{") {
		return nil, fmt.Errorf("base manifests %s: template actions left after rendering", path)
	}
	return out.Bytes(), nil
}

// dropSCTPServers removes the SCTP-serving containers of a workload's pod
// template; other objects are left alone.
func dropSCTPServers(obj *unstructured.Unstructured) error {
	containers, found, err := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
	if err != nil || !found {
		return err
	}
	kept := containers[:0]
	for _, c := range containers {
		if !servesSCTP(c) {
			kept = append(kept, c)
		}
	}
	if err := unstructured.SetNestedSlice(obj.Object, kept, "spec", "template", "spec", "containers"); err != nil {
		return fmt.Errorf("%s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	return nil
}

func servesSCTP(container any) bool {
	c, ok := container.(map[string]any)
	if !ok {
		return false
	}
	env, _ := c["env"].([]any)
	for _, e := range env {
		if v, ok := e.(map[string]any); ok {
			if name, _ := v["name"].(string); strings.HasPrefix(name, sctpEnvPrefix) {
				return true
			}
		}
	}
	return false
}

// ServeManifest serves b over HTTPS on a loopback port until stop is
// called, and returns its URL. The suite fetches a manifest given by URL
// with http.DefaultClient (and refuses plain HTTP), so ServeManifest makes
// that client trust the server's certificate.
func ServeManifest(b []byte) (url string, stop func()) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		w.Write(b)
	}))
	http.DefaultClient.Transport = srv.Client().Transport
	return srv.URL + "/base/manifests.yaml", srv.Close
}

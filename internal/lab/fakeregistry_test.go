package lab

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// serveFakeRegistry answers registry requests from files the way agnhost's
// fake-registry-server does (test/images/agnhost/fakeregistryserver): a
// tag's file names a digest, which is redirected to; a manifest or blob
// digest is read from <dir>/<algo>/<two>/<hex>/data, a manifest with the
// media type its JSON names.
func serveFakeRegistry(t *testing.T, files map[string]string) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v2/" {
			return
		}
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/v2/"), "/")
		if len(parts) != 3 {
			http.NotFound(w, r)
			return
		}
		repo, kind, id := parts[0], parts[1], parts[2]
		dir := filepath.Join(fakeRegistryDir, repo, kind)
		if kind == "manifests" && !strings.HasPrefix(id, "sha256:") {
			d, err := os.ReadFile(files[filepath.Join(dir, id)])
			if err != nil {
				http.NotFound(w, r)
				return
			}
			http.Redirect(w, r, strings.Replace(r.URL.String(), id, strings.TrimSpace(string(d)), 1), http.StatusTemporaryRedirect)
			return
		}
		algo, hex, _ := strings.Cut(id, ":")
		data, err := os.ReadFile(files[filepath.Join(dir, algo, hex[:2], hex, "data")])
		if err != nil {
			http.NotFound(w, r)
			return
		}
		if kind == "manifests" {
			mt := "application/vnd.docker.distribution.manifest.v2+json"
			if strings.Contains(string(data), "manifest.list") {
				mt = "application/vnd.docker.distribution.manifest.list.v2+json"
			}
			w.Header().Set("Content-Type", mt)
		}
		_, _ = w.Write(data)
	}))
}

// TestFakeRegistryServesTheImage: a registry client pulling pause:testing
// from the laid-out files gets the very image the lab built, through a
// manifest list with its linux/amd64 entry; a second layout reuses the
// cached files.
func TestFakeRegistryServesTheImage(t *testing.T) {
	t.Setenv("WEIR_CACHE", t.TempDir())
	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(t.TempDir(), "pause.tar")
	if err := tarball.WriteToFile(tarPath, name.MustParseReference("registry.k8s.io/pause:3.10.2").(name.Tag), img); err != nil {
		t.Fatal(err)
	}
	files, err := fakeRegistryFiles(tarPath, "pause", "testing")
	if err != nil {
		t.Fatal(err)
	}
	srv := serveFakeRegistry(t, files)
	defer srv.Close()

	// As containerd pulls: the tag to a manifest list, its linux/amd64
	// entry, then the config and layers, each checked against its digest.
	listRaw, listType := pull(t, srv.URL+"/v2/pause/manifests/testing")
	list, err := v1.ParseIndexManifest(bytes.NewReader(listRaw))
	if err != nil {
		t.Fatal(err)
	}
	if listType != string(types.DockerManifestList) || len(list.Manifests) != 1 || list.Manifests[0].Platform == nil ||
		list.Manifests[0].Platform.OS != "linux" || list.Manifests[0].Platform.Architecture != "amd64" {
		t.Fatalf("manifest list (%s) %+v, want one linux/amd64 image", listType, list.Manifests)
	}
	want, _ := img.Digest()
	if list.Manifests[0].Digest != want {
		t.Fatalf("the list names %v, want the lab's image %v", list.Manifests[0].Digest, want)
	}
	manifestRaw, _ := pullDigest(t, srv.URL+"/v2/pause/manifests/", want)
	manifest, err := v1.ParseManifest(bytes.NewReader(manifestRaw))
	if err != nil {
		t.Fatal(err)
	}
	pullDigest(t, srv.URL+"/v2/pause/blobs/", manifest.Config.Digest)
	if len(manifest.Layers) != 2 {
		t.Fatalf("%d layers, want 2", len(manifest.Layers))
	}
	for _, l := range manifest.Layers {
		pullDigest(t, srv.URL+"/v2/pause/blobs/", l.Digest)
	}
	again, err := fakeRegistryFiles(tarPath, "pause", "testing")
	if err != nil || len(again) != len(files) {
		t.Errorf("second layout: %d files (%v), want the same %d", len(again), err, len(files))
	}
}

// pull GETs url (following the registry's redirects) and returns the body
// and its content type.
func pull(t *testing.T, url string) ([]byte, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s (%v)", url, resp.Status, err)
	}
	return body, resp.Header.Get("Content-Type")
}

// pullDigest pulls the content d names under base and checks it hashes
// to d.
func pullDigest(t *testing.T, base string, d v1.Hash) ([]byte, string) {
	t.Helper()
	body, ct := pull(t, base+d.String())
	if got, _, err := v1.SHA256(bytes.NewReader(body)); err != nil || got != d {
		t.Fatalf("%s%v: content hashes to %v", base, d, got)
	}
	return body, ct
}

package image

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/weirnet/weir/internal/version"
)

var created = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)

// binDirs makes a weir-agent and weir-cni per platform, each platform's
// distinct.
func binDirs(t *testing.T) map[string]string {
	t.Helper()
	dirs := map[string]string{}
	for _, p := range []string{"linux/amd64", "linux/arm64"} {
		dir := t.TempDir()
		for _, b := range []string{"weir-agent", "weir-cni"} {
			if err := os.WriteFile(filepath.Join(dir, b), []byte(b+" for "+p), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		dirs[p] = dir
	}
	return dirs
}

// TestBuildIsReproducible: two builds of one spec have one digest, and so
// do their archives, byte for byte.
func TestBuildIsReproducible(t *testing.T) {
	spec := AgentSpec("example.test/weir-agent", "1.2.3", created, version.Info{Version: "1.2.3", Commit: "abc"}, binDirs(t))
	var digests []string
	var archives [][]byte
	for i := 0; i < 2; i++ {
		idx, err := Build(spec)
		if err != nil {
			t.Fatal(err)
		}
		d, err := idx.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d.String())
		dir := t.TempDir()
		if err := WriteLayout(filepath.Join(dir, "oci"), spec.Ref(), idx); err != nil {
			t.Fatal(err)
		}
		if err := WriteArchive(filepath.Join(dir, "oci"), filepath.Join(dir, "a.tar"), created); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "a.tar"))
		if err != nil {
			t.Fatal(err)
		}
		archives = append(archives, b)
	}
	if digests[0] != digests[1] || !bytes.Equal(archives[0], archives[1]) {
		t.Fatalf("two builds differ: digests %v, archives equal %v", digests, bytes.Equal(archives[0], archives[1]))
	}
}

// TestLayoutReadsBack: the layout is an OCI layout whose entry carries
// the image's name for containerd and for OCI tools, indexing one image
// per platform, each with its platform, entrypoint and labels, and a
// layer holding that platform's binaries, executable, owned by root and
// dated by the commit.
func TestLayoutReadsBack(t *testing.T) {
	dirs := binDirs(t)
	spec := AgentSpec("example.test/weir-agent", "1.2.3", created, version.Info{Version: "1.2.3", Commit: "abc"}, dirs)
	idx, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "oci")
	if err := WriteLayout(dir, spec.Ref(), idx); err != nil {
		t.Fatal(err)
	}
	if err := WriteLayout(dir, spec.Ref(), idx); err == nil {
		t.Error("a second layout over the first was written")
	}
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Annotations["io.containerd.image.name"] != "example.test/weir-agent:1.2.3" ||
		m.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "1.2.3" {
		t.Fatalf("layout index %+v", m)
	}
	inner, err := top.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := inner.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 2 {
		t.Fatalf("%d platform images, want 2", len(im.Manifests))
	}
	for _, desc := range im.Manifests {
		p := desc.Platform.OS + "/" + desc.Platform.Architecture
		img, err := inner.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.OS+"/"+cfg.Architecture != p || !cfg.Created.Time.Equal(created) || len(cfg.Config.Entrypoint) != 1 ||
			cfg.Config.Entrypoint[0] != AgentEntrypoint || cfg.Config.Labels["org.opencontainers.image.revision"] != "abc" {
			t.Errorf("%s config %+v", p, cfg)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 1 {
			t.Fatalf("%s: %d layers, %v", p, len(layers), err)
		}
		rc, err := layers[0].Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		files := map[string]string{}
		eachTarEntry(t, rc, func(h *tar.Header, body io.Reader) {
			if !h.ModTime.Equal(created) || h.Uid != 0 || h.Gid != 0 {
				t.Errorf("%s: %s dated %v owned by %d:%d", p, h.Name, h.ModTime, h.Uid, h.Gid)
			}
			if h.Typeflag == tar.TypeReg {
				b, _ := io.ReadAll(body)
				files[h.Name] = string(b)
				if h.Mode != 0o755 {
					t.Errorf("%s: %s mode %o, want 0755", p, h.Name, h.Mode)
				}
			}
		})
		rc.Close()
		if files["usr/bin/weir-agent"] != "weir-agent for "+p || files["usr/bin/weir-cni"] != "weir-cni for "+p || len(files) != 2 {
			t.Errorf("%s layer holds %v", p, files)
		}
	}
}

// TestArchiveIsTheLayout: the archive holds the layout's files.
func TestArchiveIsTheLayout(t *testing.T) {
	spec := AgentSpec("example.test/weir-agent", "1.2.3", created, version.Info{Version: "1.2.3"}, binDirs(t))
	idx, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	lay := filepath.Join(dir, "oci")
	if err := WriteLayout(lay, spec.Ref(), idx); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "a.tar")
	if err := WriteArchive(lay, archive, created); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := map[string]bool{}
	eachTarEntry(t, f, func(h *tar.Header, body io.Reader) {
		seen[h.Name] = true
		if h.Name == "index.json" {
			var ix struct {
				Manifests []struct {
					Annotations map[string]string `json:"annotations"`
				} `json:"manifests"`
			}
			if err := json.NewDecoder(body).Decode(&ix); err != nil || len(ix.Manifests) != 1 {
				t.Fatalf("index.json: %v %+v", err, ix)
			}
		}
	})
	if !seen["oci-layout"] || !seen["index.json"] || len(seen) < 2+1+2*3 {
		t.Errorf("archive holds %v, want oci-layout, index.json and the blobs of an index and two images", seen)
	}
}

// TestBadSpecs are refused with ErrBadSpec, naming the problem.
func TestBadSpecs(t *testing.T) {
	good := AgentSpec("example.test/weir-agent", "1.2.3", created, version.Info{}, binDirs(t))
	for name, change := range map[string]func(*Spec){
		"no tag":        func(s *Spec) { s.Tag = "" },
		"no platform":   func(s *Spec) { s.Files = nil },
		"bad platform":  func(s *Spec) { s.Files["amd64"] = s.Files["linux/amd64"] },
		"relative path": func(s *Spec) { s.Files["linux/amd64"] = map[string]string{"usr/bin/x": "/dev/null"} },
	} {
		s := good
		s.Files = map[string]map[string]string{}
		for k, v := range good.Files {
			s.Files[k] = v
		}
		change(&s)
		if _, err := Build(s); !errors.Is(err, ErrBadSpec) {
			t.Errorf("%s: %v, want ErrBadSpec", name, err)
		}
	}
}

// eachTarEntry calls fn with each entry of the tar stream r and its body.
func eachTarEntry(t *testing.T, r io.Reader, fn func(*tar.Header, io.Reader)) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		fn(h, tr)
	}
}

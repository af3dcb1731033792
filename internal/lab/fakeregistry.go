package lab

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/weirnet/weir/internal/fsutil"
)

// fakeRegistryDir is where agnhost's fake-registry-server serves images
// from. Upstream's agnhost image is built with a copy of registry.k8s.io's
// pause image there, as "pause:testing"; the lab's carries its own pause
// image instead, so the LocalhostNodePorts spec that has a node pull from
// the server through a localhost NodePort finds the image it asks for.
const fakeRegistryDir = "/var/registry"

// fakeRegistryFiles lays out the image in the docker-archive at tarPath
// as repository repo, tag tag, in the server's layout: the tag file holds
// the digest of a manifest list (one linux/amd64 entry), and manifests
// and blobs are stored by digest as <dir>/sha256/<first two>/<hex>/data.
// The files are written once under the cache, keyed by that digest; the
// result maps each path in the image to its file on the host.
func fakeRegistryFiles(tarPath, repo, tag string) (map[string]string, error) {
	img, err := tarball.ImageFromPath(tarPath, nil)
	if err != nil {
		return nil, fmt.Errorf("fake registry: read %s: %w", tarPath, err)
	}
	list := mutate.IndexMediaType(mutate.AppendManifests(empty.Index, mutate.IndexAddendum{
		Add:        img,
		Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}},
	}), types.DockerManifestList)
	listDigest, err := list.Digest()
	if err != nil {
		return nil, fmt.Errorf("fake registry: manifest list: %w", err)
	}
	listRaw, err := list.RawManifest()
	if err != nil {
		return nil, err
	}
	imgDigest, err := img.Digest()
	if err != nil {
		return nil, err
	}
	imgRaw, err := img.RawManifest()
	if err != nil {
		return nil, err
	}
	configName, err := img.ConfigName()
	if err != nil {
		return nil, err
	}
	configRaw, err := img.RawConfigFile()
	if err != nil {
		return nil, err
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}

	root := filepath.Join(CacheDir(), "fake-registry", listDigest.Hex)
	files := map[string]string{}
	put := func(rel string, data []byte) error {
		host := filepath.Join(root, rel)
		files[filepath.Join(fakeRegistryDir, repo, rel)] = host
		if _, err := os.Stat(host); err == nil {
			return nil
		}
		if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
			return err
		}
		return fsutil.WriteFileAtomic(host, data, 0o644)
	}
	if err := put(filepath.Join("manifests", tag), []byte(listDigest.String()+"\n")); err != nil {
		return nil, err
	}
	if err := put(byDigest("manifests", listDigest), listRaw); err != nil {
		return nil, err
	}
	if err := put(byDigest("manifests", imgDigest), imgRaw); err != nil {
		return nil, err
	}
	if err := put(byDigest("blobs", configName), configRaw); err != nil {
		return nil, err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return nil, err
		}
		data, err := compressedBytes(l)
		if err != nil {
			return nil, fmt.Errorf("fake registry: layer %s: %w", d, err)
		}
		if err := put(byDigest("blobs", d), data); err != nil {
			return nil, err
		}
	}
	return files, nil
}

// byDigest is where the server looks for the manifest or blob d under
// dir.
func byDigest(dir string, d v1.Hash) string {
	return filepath.Join(dir, d.Algorithm, d.Hex[:2], d.Hex, "data")
}

// compressedBytes is the layer as a registry serves it (the pause image's
// is a few MiB).
func compressedBytes(l v1.Layer) ([]byte, error) {
	rc, err := l.Compressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// ErrBadSpec is wrapped by the error of a Spec that cannot be built.
var ErrBadSpec = errors.New("bad image spec")

// Spec is an image to build for one or more platforms.
type Spec struct {
	// Repository and Tag name the image, e.g. ghcr.io/weirnet/weir-agent
	// and 0.1.0; the layout and the archive carry the name.
	Repository, Tag string
	// Created is the image's creation time, and every file's: the source
	// commit's time, so builds of one commit are identical.
	Created time.Time
	// Files are, per platform ("linux/amd64"), the image's files: path
	// in the image -> file on this machine. Each is made executable.
	Files      map[string]map[string]string
	Entrypoint []string
	// Labels are the image config's labels (org.opencontainers.image.*).
	Labels map[string]string
}

// Ref is the image's name, repository:tag.
func (s Spec) Ref() string { return s.Repository + ":" + s.Tag }

// Platforms are the spec's platforms, sorted.
func (s Spec) Platforms() []string {
	out := make([]string, 0, len(s.Files))
	for p := range s.Files {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

func (s Spec) validate() error {
	if s.Repository == "" || s.Tag == "" || strings.ContainsAny(s.Tag, ":/@") {
		return fmt.Errorf("name %q: want repository:tag: %w", s.Ref(), ErrBadSpec)
	}
	if len(s.Files) == 0 {
		return fmt.Errorf("%s: no platform: %w", s.Ref(), ErrBadSpec)
	}
	for p, files := range s.Files {
		if os, arch, ok := strings.Cut(p, "/"); !ok || os == "" || arch == "" {
			return fmt.Errorf("platform %q: want os/arch such as linux/arm64: %w", p, ErrBadSpec)
		}
		if len(files) == 0 {
			return fmt.Errorf("%s: no files for %s: %w", s.Ref(), p, ErrBadSpec)
		}
		for dst := range files {
			if !path.IsAbs(dst) || path.Clean(dst) != dst {
				return fmt.Errorf("%s: path %q in the image: want a clean absolute path: %w", s.Ref(), dst, ErrBadSpec)
			}
		}
	}
	return nil
}

// Build builds the image of every platform and the index over them.
func Build(s Spec) (v1.ImageIndex, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	var adds []mutate.IndexAddendum
	for _, p := range s.Platforms() {
		img, err := s.platformImage(p)
		if err != nil {
			return nil, fmt.Errorf("image %s for %s: %w", s.Ref(), p, err)
		}
		osName, arch, _ := strings.Cut(p, "/")
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			MediaType: types.OCIManifestSchema1, Platform: &v1.Platform{OS: osName, Architecture: arch}}})
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	return mutate.AppendManifests(idx, adds...), nil
}

// platformImage is one platform's image: a layer of its files, and a
// config naming the platform and the entrypoint.
func (s Spec) platformImage(platform string) (v1.Image, error) {
	layerTar, err := s.layer(s.Files[platform])
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: s.Created}, CreatedBy: "weir image build"}}); err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	osName, arch, _ := strings.Cut(platform, "/")
	cfg.OS, cfg.Architecture, cfg.Created = osName, arch, v1.Time{Time: s.Created}
	cfg.Config.Entrypoint = s.Entrypoint
	cfg.Config.Env = []string{"PATH=/usr/bin:/bin"}
	cfg.Config.Labels = s.Labels
	return mutate.ConfigFile(img, cfg)
}

// layer is the tar of files, with their parent directories, every entry
// owned by root and dated s.Created.
func (s Spec) layer(files map[string]string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	dsts := make([]string, 0, len(files))
	for dst := range files {
		dsts = append(dsts, dst)
	}
	sort.Strings(dsts)
	for _, dst := range dsts {
		var parents []string
		for d := path.Dir(dst); d != "/"; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755,
				ModTime: s.Created, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
		b, err := os.ReadFile(files[dst])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", dst, err)
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(dst, "/"), Mode: 0o755,
			Size: int64(len(b)), ModTime: s.Created, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteLayout writes idx as an OCI image layout in dir (which must not
// exist yet), its entry named ref.
func WriteLayout(dir, ref string, idx v1.ImageIndex) error {
	if _, err := os.Stat(dir); err == nil {
		return fmt.Errorf("%s exists: remove it, or give another --out", dir)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("write OCI layout %s: %w", dir, err)
	}
	_, tag, _ := strings.Cut(ref[strings.LastIndex(ref, "/")+1:], ":")
	// containerd names an imported image by the first, the OCI
	// convention (skopeo, crane) by the second.
	err = p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          ref,
		"org.opencontainers.image.ref.name": tag,
	}))
	if err != nil {
		return fmt.Errorf("write OCI layout %s: %w", dir, err)
	}
	return nil
}

// WriteArchive writes the layout in dir as an OCI archive at file: a tar
// of the layout's files, sorted, dated created.
func WriteArchive(dir, file string, created time.Time) (retErr error) {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			names = append(names, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	f, err := os.Create(file + ".tmp")
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			f.Close()
			os.Remove(file + ".tmp")
		}
	}()
	tw := tar.NewWriter(f)
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o644, Size: int64(len(b)),
			ModTime: created, Format: tar.FormatPAX}); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(file+".tmp", file)
}

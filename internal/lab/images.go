package lab

import (
	"archive/tar"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Image references the lab provides. The pause, agnhost and busybox names
// are the ones Kubernetes and its e2e suites ask for, so nothing is ever
// pulled: every node already holds an image of that name.
const (
	PauseImage   = "registry.k8s.io/pause:3.10.2"
	AgnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	BusyboxImage = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"
	// GlibcDNSTestingImage is upstream's Debian (bookworm) image with
	// dnsutils and CoreDNS, which the DNS specs' probes and servers run.
	GlibcDNSTestingImage = "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1"
	// BoomServerImage is the conntrack spec's server, which injects
	// out-of-window TCP segments (kubernetes issue 74839).
	BoomServerImage = "registry.k8s.io/e2e-test-images/regression-issue-74839:1.5"
	AgentImage      = "weir.local/weir-agent:dev"
	CoreDNSImage    = "weir.local/coredns:" + CoreDNSVersion
	// LoadToolsImage holds iperf3, sockperf and wrk for benchmarks in pods.
	LoadToolsImage = "weir.local/loadtools:dev"
)

// Older agnhost names that conformance suites' manifests ask for: cyclonus's
// server pods (2.43) and the ClusterNetworkPolicy suite's base manifests
// (2.45). The lab's agnhost image carries them as more tags.
const (
	CyclonusAgnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.43"
	CNPAgnhostImage      = "registry.k8s.io/e2e-test-images/agnhost:2.45"
)

// imageSpec is a container image built from files on this machine.
type imageSpec struct {
	Refs    []string          // every name the image is tagged with
	Files   map[string]string // path in the image -> file on the host
	Scripts map[string]string // path in the image -> content of an executable script
	Busybox bool              // add /bin/busybox and a link per applet
	// SharedLibs carries the shared libraries (and the dynamic loader) of
	// dynamically linked Files, as ldd resolves them on this machine.
	SharedLibs bool
	Entrypoint []string
	Cmd        []string
}

// labImages are the images every node of a Kubernetes lab imports.
func labImages(binDir string, bins map[string]string) ([]imageSpec, error) {
	agnhostDir := bins["agnhost"]
	porterDir, err := kubernetesSourceDir("test/images/agnhost/porter")
	if err != nil {
		return nil, err
	}
	pause := imageSpec{Refs: []string{PauseImage}, Files: map[string]string{"/pause": filepath.Join(binDir, "weir-pause")}, Entrypoint: []string{"/pause"}}
	// The fake registry's pause image is another image than the nodes'
	// sandbox image (a second copy of the program makes its layer and ID
	// differ): the kubelet remembers that an image ID was pulled with
	// credentials, and would then insist on pulling the preloaded
	// sandbox image of the same ID again, from the Internet, before
	// running it in a pod without them.
	testing := imageSpec{Refs: []string{"weir.local/fake-registry/pause:testing"},
		Files: map[string]string{"/pause": filepath.Join(binDir, "weir-pause"), "/pause-testing": filepath.Join(binDir, "weir-pause")}, Entrypoint: []string{"/pause"}}
	testingPath, err := testing.build()
	if err != nil {
		return nil, err
	}
	registry, err := fakeRegistryFiles(testingPath, "pause", "testing")
	if err != nil {
		return nil, err
	}
	agnhost := agnhostFiles(filepath.Join(agnhostDir, "agnhost"), filepath.Join(bins["coredns"], "coredns"), porterDir)
	for dst, src := range registry {
		agnhost[dst] = src
	}
	return []imageSpec{
		pause,
		// As upstream's image: `agnhost pause` when a pod gives no command,
		// upstream's tools (agnhostTools), and the pause image in the
		// fake registry's directory.
		{Refs: []string{AgnhostImage, CyclonusAgnhostImage, CNPAgnhostImage}, Files: agnhost,
			SharedLibs: true, Busybox: true, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}},
		{Refs: []string{BusyboxImage}, Busybox: true, Cmd: []string{"sh"}},
		{Refs: []string{BoomServerImage}, Files: map[string]string{"/regression-issue-74839": filepath.Join(agnhostDir, "regression-issue-74839")},
			Entrypoint: []string{"/regression-issue-74839"}},
		// This machine's Debian bookworm tools, as upstream's image has
		// them: dash, dig, glibc's getent, and CoreDNS at /coredns.
		{Refs: []string{GlibcDNSTestingImage}, Files: map[string]string{
			"/bin/sh": "/usr/bin/dash", "/usr/bin/dig": "/usr/bin/dig", "/usr/bin/getent": "/usr/bin/getent",
			"/coredns": filepath.Join(bins["coredns"], "coredns"),
		}, SharedLibs: true, Busybox: true, Cmd: []string{"sh"}},
		{Refs: []string{CoreDNSImage}, Files: map[string]string{"/coredns": filepath.Join(bins["coredns"], "coredns")}, Entrypoint: []string{"/coredns"}},
		// The benchmarks' load generators, Debian's builds with their libraries.
		{Refs: []string{LoadToolsImage}, Files: map[string]string{
			"/usr/bin/iperf3": "/usr/bin/iperf3", "/usr/bin/sockperf": "/usr/bin/sockperf", "/usr/bin/wrk": "/usr/bin/wrk",
		}, SharedLibs: true, Busybox: true, Cmd: []string{"sh"}},
	}, nil
}

const busyboxPath = "/bin/busybox" // Debian's busybox-static

// agnhostTools are the programs upstream's agnhost image installs on its
// Alpine base (netcat-openbsd, curl, bind-tools, iproute2, bash, socat,
// musl's getent, and busybox's wget),
// here Debian's builds of the same tools with their libraries. The suites
// run them in their pods (`nc -v -t -w 2`, `curl`, `dig`, `bash -c`);
// busybox's minimal nc, for one, has none of those flags.
var agnhostTools = map[string]string{
	"/bin/nc":       "/bin/nc.openbsd",
	"/usr/bin/curl": "/usr/bin/curl",
	"/usr/bin/dig":  "/usr/bin/dig",
	"/bin/ip":       "/usr/sbin/ip",
	"/bin/bash":     "/usr/bin/bash",
	// A shell that runs programs from PATH: Debian's static busybox runs
	// its own applets first (busybox nc for `sh -c 'nc -v ...'`).
	"/bin/sh":        "/usr/bin/dash",
	"/usr/bin/socat": "/usr/bin/socat",
	// GNU wget for busybox's: Debian's static busybox crashes on
	// `wget -T` (a timeout), which the Service specs run from pods.
	"/bin/wget": "/usr/bin/wget",
	// getent, which upstream's Alpine image has and busybox lacks: the
	// DNS specs' probes check the pod's hosts file with `getent hosts`
	// (glibc 2.36 reads files before DNS without an nsswitch.conf).
	"/usr/bin/getent": "/usr/bin/getent",
}

// agnhostFiles are the agnhost image's files: the static agnhost binary,
// CoreDNS at /coredns and porter's TLS key pair at /localhost.crt and
// /localhost.key as upstream ships them (the DNS specs' test servers run
// CoreDNS; the Proxy specs' porter serves TLS with the pair), and
// agnhostTools.
func agnhostFiles(agnhost, coredns, porterDir string) map[string]string {
	files := map[string]string{"/agnhost": agnhost, "/coredns": coredns,
		"/localhost.crt": filepath.Join(porterDir, "localhost.crt"), "/localhost.key": filepath.Join(porterDir, "localhost.key")}
	for dst, src := range agnhostTools {
		files[dst] = src
	}
	return files
}

// kubernetesSourceDir is a directory of the Kubernetes module's source in
// Go's module cache, where building agnhost put it.
func kubernetesSourceDir(rel string) (string, error) {
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMODCACHE: %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "k8s.io", "kubernetes@"+KubernetesVersion, rel)
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("kubernetes %s source (%s): %w; run `weir lab build` to fetch it", KubernetesVersion, rel, err)
	}
	return dir, nil
}

// build writes the image as a docker-archive tarball under the cache,
// keyed by the content of its inputs, and returns its path; an unchanged
// image is not rebuilt.
func (s imageSpec) build() (string, error) {
	files := make(map[string]string, len(s.Files)+1)
	for k, v := range s.Files {
		files[k] = v
	}
	if s.SharedLibs {
		if err := addSharedLibs(files); err != nil {
			return "", fmt.Errorf("image %s: %w", s.Refs[0], err)
		}
	} else {
		for dst, src := range files {
			if err := checkStatic(src); err != nil {
				return "", fmt.Errorf("image %s: %s: %w", s.Refs[0], dst, err)
			}
		}
	}
	if s.Busybox {
		files["/bin/busybox"] = busyboxPath
	}
	key, err := s.key(files)
	if err != nil {
		return "", err
	}
	out := filepath.Join(CacheDir(), "images", key+".tar")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", err
	}
	layerPath := out + ".layer"
	defer os.Remove(layerPath)
	if err := s.writeLayer(layerPath, files); err != nil {
		return "", err
	}
	layer, err := tarball.LayerFromFile(layerPath)
	if err != nil {
		return "", fmt.Errorf("image %s: layer: %w", s.Refs[0], err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return "", err
	}
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: "amd64", OS: "linux",
		Config: v1.Config{Entrypoint: s.Entrypoint, Cmd: s.Cmd, Env: []string{"PATH=/usr/bin:/bin"}},
		RootFS: v1.RootFS{Type: "layers", DiffIDs: mustDiffIDs(layer)},
	})
	if err != nil {
		return "", err
	}
	refs := map[name.Reference]v1.Image{}
	for _, r := range s.Refs {
		tag, err := name.NewTag(r)
		if err != nil {
			return "", fmt.Errorf("image name %s: %w", r, err)
		}
		refs[tag] = img
	}
	tmp := out + ".tmp"
	if err := tarball.MultiRefWriteToFile(tmp, refs); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("write image %s: %w", s.Refs[0], err)
	}
	return out, os.Rename(tmp, out)
}

func mustDiffIDs(l v1.Layer) []v1.Hash {
	h, err := l.DiffID()
	if err != nil {
		return nil
	}
	return []v1.Hash{h}
}

// key hashes the image's names, entrypoint and input files.
func (s imageSpec) key(files map[string]string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%q %q %q\n", s.Refs, s.Entrypoint, s.Cmd)
	for _, dst := range sortedKeys(s.Scripts) {
		fmt.Fprintf(h, "%s %q\n", dst, s.Scripts[dst])
	}
	if err := hashFiles(h, files); err != nil {
		return "", fmt.Errorf("image %s: %w", s.Refs[0], err)
	}
	base := strings.NewReplacer("/", "_", ":", "_").Replace(s.Refs[0])
	return base + "-" + hex.EncodeToString(h.Sum(nil))[:16], nil
}

// writeLayer writes the image's single layer: the files, their parent
// directories, and busybox's applet links.
func (s imageSpec) writeLayer(path string, files map[string]string) (retErr error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if err := f.Close(); retErr == nil {
			retErr = err
		}
	}()
	tw := tar.NewWriter(f)
	dirs := map[string]bool{}
	addDir := func(d string) error {
		for _, p := range parents(d) {
			if dirs[p] {
				continue
			}
			dirs[p] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(p, "/") + "/", Mode: 0o755}); err != nil {
				return err
			}
		}
		return nil
	}
	for _, d := range []string{"/tmp", "/etc", "/proc", "/sys", "/dev"} {
		if err := addDir(d); err != nil {
			return err
		}
	}
	for _, dst := range sortedKeys(files) {
		if err := addDir(filepath.Dir(dst)); err != nil {
			return err
		}
		if err := addFile(tw, dst, files[dst]); err != nil {
			return err
		}
	}
	for _, dst := range sortedKeys(s.Scripts) {
		if err := addDir(filepath.Dir(dst)); err != nil {
			return err
		}
		body := s.Scripts[dst]
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(dst, "/"), Mode: 0o755, Size: int64(len(body))}); err != nil {
			return err
		}
		if _, err := io.WriteString(tw, body); err != nil {
			return err
		}
	}
	if s.Busybox {
		applets, err := busyboxApplets()
		if err != nil {
			return err
		}
		for _, a := range applets {
			_, script := s.Scripts["/bin/"+a]
			if _, taken := files["/bin/"+a]; taken || script || a == "busybox" {
				continue
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777}); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

func addFile(tw *tar.Writer, dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(dst, "/"), Mode: 0o755, Size: st.Size()}); err != nil {
		return err
	}
	_, err = io.Copy(tw, in)
	return err
}

// parents lists /a, /a/b, /a/b/c for /a/b/c.
func parents(d string) []string {
	var out []string
	for p := d; p != "/" && p != "."; p = filepath.Dir(p) {
		out = append([]string{p}, out...)
	}
	return out
}

func busyboxApplets() ([]string, error) {
	out, err := exec.Command(busyboxPath, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("list busybox applets (install busybox-static): %w", err)
	}
	return strings.Fields(string(out)), nil
}

// addSharedLibs adds to files every library ldd says its binaries load,
// at the same path, and the dynamic loader.
func addSharedLibs(files map[string]string) error {
	for _, src := range sortedKeys(files) {
		if !isELF(files[src]) || checkStatic(files[src]) == nil {
			continue // data (a key pair), or a static binary such as agnhost: no library to load
		}
		out, err := exec.Command("ldd", files[src]).Output()
		if err != nil {
			return fmt.Errorf("ldd %s (is it installed?): %w", files[src], err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
				files[f[2]] = f[2]
			case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
				files[f[0]] = f[0] // the loader
			case strings.Contains(line, "not found"):
				return fmt.Errorf("%s: %s", files[src], strings.TrimSpace(line))
			}
		}
	}
	return nil
}

// isELF says whether path is an ELF file (a program), not data.
func isELF(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// checkStatic fails for a dynamically linked binary: the images have no
// libc to run it with.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; build it with CGO_ENABLED=0", path)
		}
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// hashFiles writes each file's image path and content into h, in path
// order: an image cache's key.
func hashFiles(h io.Writer, files map[string]string) error {
	for _, dst := range sortedKeys(files) {
		f, err := os.Open(files[dst])
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\n", dst)
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

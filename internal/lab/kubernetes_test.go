package lab

import (
	"slices"
	"strings"
	"testing"
)

func TestKubernetesBuildPinsStagingAndVersion(t *testing.T) {
	b := KubernetesBuild()
	if got := b.Replace["k8s.io/client-go"]; got != "k8s.io/client-go@v0.37.2" {
		t.Fatalf("client-go replaced by %q, want the v0.37.2 release", got)
	}
	if len(b.Replace) != len(kubernetesStaging) {
		t.Fatalf("%d replacements for %d staging modules", len(b.Replace), len(kubernetesStaging))
	}
	for _, want := range []string{
		"-X k8s.io/component-base/version.gitVersion=v1.37.2",
		"-X k8s.io/client-go/pkg/version.gitMinor=37",
		"-X k8s.io/component-base/version.gitMajor=1",
	} {
		if !strings.Contains(b.LDFlags, want) {
			t.Fatalf("ldflags %q lack %q", b.LDFlags, want)
		}
	}
	bins := strings.Join(b.binaries(), " ")
	if bins != "kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-proxy" {
		t.Fatalf("binaries %q", bins)
	}
	if e := etcdBuild(); strings.Join(e.binaries(), " ") != "etcd" || !strings.Contains(e.Main, "etcdmain.Main") {
		t.Fatalf("etcd build: %+v", e)
	}
}

func TestGoBuildCachesByVersion(t *testing.T) {
	t.Setenv("WEIR_CACHE", "/var/cache/x")
	b := containerdBuild()
	if b.dir() != "/var/cache/x/containerd@"+ContainerdVersion {
		t.Fatalf("cache dir %s", b.dir())
	}
	if b.Tags != "no_btrfs" {
		t.Fatalf("tags %q", b.Tags)
	}
}

// TestAgentProxyArgs: switching the Service proxy rewrites only the two
// flags that say who answers Services, whatever form they had.
func TestAgentProxyArgs(t *testing.T) {
	argv := []string{"weir-agent", "--node-name", "n1", "--kube-proxy-replacement=true", "--socket", "/run/x.sock"}
	got := agentProxyArgs(argv, false)
	want := []string{"weir-agent", "--node-name", "n1", "--socket", "/run/x.sock", "--kube-proxy-replacement=false", "--socket-lb=false"}
	if !slices.Equal(got, want) {
		t.Errorf("to kube-proxy: %q, want %q", got, want)
	}
	if back := agentProxyArgs(got, true); !slices.Equal(back, []string{"weir-agent", "--node-name", "n1", "--socket", "/run/x.sock", "--kube-proxy-replacement=true", "--socket-lb=true"}) {
		t.Errorf("back to Weir: %q", back)
	}
	if argv[3] != "--kube-proxy-replacement=true" {
		t.Errorf("the original command line changed: %q", argv)
	}
}

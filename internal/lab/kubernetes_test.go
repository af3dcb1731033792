package lab

import (
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

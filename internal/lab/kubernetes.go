package lab

import (
	"context"
	"fmt"
	"io"
	"strings"
)

// Versions of the cluster components the lab builds, verified on this kind
// of machine (see shared/lab-recipe.md).
const (
	KubernetesVersion = "v1.37.2"
	EtcdVersion       = "v3.6.16"
	ContainerdVersion = "v2.4.2"
	CoreDNSVersion    = "v1.15.0"
	HelmVersion       = "v3.22.0"
)

// kubernetesStaging are the modules kubernetes' own go.mod replaces with
// its staging directories; a build from the module proxy pins each to the
// matching v0 release.
var kubernetesStaging = []string{
	"api", "apiextensions-apiserver", "apimachinery", "apiserver", "cli-runtime",
	"client-go", "cloud-provider", "cluster-bootstrap", "code-generator", "component-base",
	"component-helpers", "controller-manager", "cri-api", "cri-client", "cri-streaming",
	"csi-translation-lib", "dynamic-resource-allocation", "endpointslice", "externaljwt", "kms",
	"kube-aggregator", "kube-controller-manager", "kube-proxy", "kube-scheduler", "kubectl",
	"kubelet", "metrics", "mount-utils", "pod-security-admission", "sample-apiserver",
	"sample-cli-plugin", "sample-controller", "streaming",
}

// KubernetesBuild is the build of the control plane, kubelet and kubectl.
func KubernetesBuild() GoBuild {
	staging := "v0." + strings.TrimPrefix(KubernetesVersion, "v1.")
	replace := map[string]string{}
	for _, m := range kubernetesStaging {
		replace["k8s.io/"+m] = "k8s.io/" + m + "@" + staging
	}
	major, minor := "1", strings.Split(strings.TrimPrefix(KubernetesVersion, "v1."), ".")[0]
	var ld []string
	// Without these every binary reports v0.0.0-master, which kubectl
	// version and every Node's status would show.
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		ld = append(ld, fmt.Sprintf("-X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s", pkg, KubernetesVersion, pkg, major, pkg, minor))
	}
	var pkgs []string
	for _, c := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl", "kube-proxy"} {
		pkgs = append(pkgs, "k8s.io/kubernetes/cmd/"+c)
	}
	return GoBuild{
		Name: "kubernetes", Module: "k8s.io/kubernetes", Version: KubernetesVersion,
		Pkgs: pkgs, Replace: replace, LDFlags: "-s -w " + strings.Join(ld, " "),
	}
}

// agnhostBuild is Kubernetes' all-purpose test image binary (netexec,
// serve-hostname, connect, ...) and the conntrack spec's boom server
// (regression-issue-74839), static so they run in images with no libc.
func agnhostBuild() GoBuild {
	b := KubernetesBuild()
	b.Name, b.Env = "agnhost", []string{"CGO_ENABLED=0"}
	b.Pkgs = []string{"k8s.io/kubernetes/test/images/agnhost", "k8s.io/kubernetes/test/images/regression-issue-74839"}
	b.LDFlags = "-s -w"
	return b
}

// corednsBuild is CoreDNS, the cluster's DNS server, static for its image.
func corednsBuild() GoBuild {
	return GoBuild{
		Name: "coredns", Module: "github.com/coredns/coredns", Version: CoreDNSVersion,
		Pkgs: []string{"github.com/coredns/coredns"}, Env: []string{"CGO_ENABLED=0"}, LDFlags: "-s -w",
	}
}

// etcdBuild is etcd as a three-line main over etcdmain.
func etcdBuild() GoBuild {
	return GoBuild{
		Name: "etcd", Module: "go.etcd.io/etcd/server/v3", Version: EtcdVersion, Pkgs: []string{"."},
		Main:    "package main\n\nimport (\n\t\"os\"\n\n\t\"go.etcd.io/etcd/server/v3/etcdmain\"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n",
		LDFlags: "-s -w",
	}
}

// containerdBuild is containerd, ctr and the runc shim.
func containerdBuild() GoBuild {
	mod := "github.com/containerd/containerd/v2"
	return GoBuild{
		Name: "containerd", Module: mod, Version: ContainerdVersion,
		Pkgs: []string{mod + "/cmd/containerd", mod + "/cmd/ctr", mod + "/cmd/containerd-shim-runc-v2"},
		Tags: "no_btrfs", LDFlags: "-s -w",
	}
}

// HelmBuild is helm, which installs Weir's chart (deploy/helm/weir) in
// the lab and lints and renders it in the tests.
func HelmBuild() GoBuild {
	mod := "helm.sh/helm/v3"
	return GoBuild{
		Name: "helm", Module: mod, Version: HelmVersion, Pkgs: []string{mod + "/cmd/helm"},
		Env: []string{"CGO_ENABLED=0"}, LDFlags: "-s -w -X helm.sh/helm/v3/internal/version.version=" + HelmVersion,
	}
}

// ClusterBinaries builds (once, then from the cache) everything a
// Kubernetes lab runs and returns the directory of each build.
func ClusterBinaries(ctx context.Context, progress io.Writer) (map[string]string, error) {
	out := map[string]string{}
	for _, b := range []GoBuild{etcdBuild(), containerdBuild(), KubernetesBuild(), agnhostBuild(), corednsBuild(), referencePluginsBuild(), HelmBuild()} {
		dir, err := b.Run(ctx, progress)
		if err != nil {
			return nil, err
		}
		out[b.Name] = dir
	}
	return out, nil
}

package cnp_test

import (
	"flag"
	"os"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	api "sigs.k8s.io/network-policy-api/apis/v1alpha2"
	"sigs.k8s.io/network-policy-api/conformance"
	"sigs.k8s.io/network-policy-api/conformance/tests"
	"sigs.k8s.io/network-policy-api/conformance/utils/flags"
	"sigs.k8s.io/network-policy-api/conformance/utils/suite"

	"github.com/weirnet/weir/conformance/cnp"
)

// hostNetworkPorts is how many ports the suite's host-network workload
// listens on, from --host-network-port-start on.
const hostNetworkPorts = 8

var hostNetworkPortStart = flag.Int("host-network-port-start", 34345,
	"first of the 8 node ports the suite's host-network pods listen on")

// TestConformance runs every conformance test of the suite (narrow it with
// -test.run=TestConformance/NAME and -test.skip) with the suite's own
// flags: -kubeconfig, -supported-features, -exempt-features, -debug,
// -cleanup-base-resources.
func TestConformance(t *testing.T) {
	if flag.Lookup(config.KubeconfigFlagName).Value.String() == "" && os.Getenv("KUBECONFIG") == "" {
		// In CI the suite must run (the e2e test runs this binary against
		// the lab cluster); a run that found no cluster is a failure there.
		if os.Getenv("CI") == "true" {
			t.Fatal("no cluster: set -kubeconfig or KUBECONFIG (CI=true: the suite may not be skipped)")
		}
		t.Skip("no cluster: set -kubeconfig or KUBECONFIG")
	}
	// controller-runtime complains, with a stack trace, of a logger never set.
	ctrllog.SetLogger(logr.Discard())
	cfg, err := config.GetConfig()
	if err != nil {
		t.Fatalf("load kubeconfig: %v", err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	if err := api.Install(c.Scheme()); err != nil {
		t.Fatalf("install the ClusterNetworkPolicy API in the scheme: %v", err)
	}
	clientset, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("clientset: %v", err)
	}

	ports := make([]int, hostNetworkPorts)
	for i := range ports {
		ports[i] = *hostNetworkPortStart + i
	}
	const basePath = "base/manifests.yaml"
	base, err := cnp.BaseWithoutSCTP(conformance.Manifests, basePath, ports)
	if err != nil {
		t.Fatal(err)
	}
	baseURL, stop := cnp.ServeManifest(base)
	t.Cleanup(stop)
	t.Logf("base manifests: %s without its SCTP servers, served at %s", basePath, baseURL)

	s := suite.New(suite.Options{
		Client:                     c,
		ClientSet:                  clientset,
		KubeConfig:                 *cfg,
		Debug:                      *flags.ShowDebug,
		BaseManifests:              baseURL,
		HostNetworkPortRangeStart:  ports[0],
		HostNetworkPortRangeEnd:    ports[len(ports)-1],
		CleanupBaseResources:       *flags.CleanupBaseResources,
		SupportedFeatures:          suite.ParseSupportedFeatures(*flags.SupportedFeatures),
		ExemptFeatures:             suite.ParseSupportedFeatures(*flags.ExemptFeatures),
		EnableAllSupportedFeatures: *flags.EnableAllSupportedFeatures,
	})
	t.Logf("supported features: %v", s.SupportedFeatures.UnsortedList())
	s.Setup(t)
	s.Run(t, tests.ConformanceTests)
}

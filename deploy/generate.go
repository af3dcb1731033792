package deploy

// The CRDs of the three policy kinds are generated, never edited, and
// copied into the chart with SecurityIdentity's.
// The upstream ClusterNetworkPolicy CRD is copied from the module Weir
// builds with (hack/upstreamcrd says why not controller-gen), from its
// experimental channel: the standard one drops the `nodes` peer, which
// Weir enforces (and `domainNames`, which Weir fails closed);
// WeirClusterNetworkPolicy's and WeirNetworkPolicy's come from their Go
// types in internal/k8s/apis/weirv1alpha1.
//
//go:generate go run ../hack/upstreamcrd -channel experimental -out crd-clusternetworkpolicies.yaml
//go:generate sh -c "set -e; rm -rf crdgen.tmp; go run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0 crd paths=../internal/k8s/apis/weirv1alpha1 output:crd:dir=crdgen.tmp; mv crdgen.tmp/weir.io_weirclusternetworkpolicies.yaml crd-weirclusternetworkpolicies.yaml; mv crdgen.tmp/weir.io_weirnetworkpolicies.yaml crd-weirnetworkpolicies.yaml; rm -r crdgen.tmp"
//go:generate sh -c "cp crds.yaml helm/weir/crds/securityidentities.yaml && cp crd-clusternetworkpolicies.yaml helm/weir/crds/clusternetworkpolicies.yaml && cp crd-weirclusternetworkpolicies.yaml helm/weir/crds/weirclusternetworkpolicies.yaml && cp crd-weirnetworkpolicies.yaml helm/weir/crds/weirnetworkpolicies.yaml && cp ../docs/grafana-dashboard.json helm/weir/dashboards/weir.json"

package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	"sigs.k8s.io/yaml"
)

// TestClusterPolicyCRDs checks the generated CRDs of the two cluster policy
// kinds: names, scope, one served storage version with a status
// subresource, and the rule actions each kind allows.
func TestClusterPolicyCRDs(t *testing.T) {
	for _, tc := range []struct {
		file, name, group, kind, version string
		actions                          []string
	}{
		{"crd-clusternetworkpolicies.yaml", "clusternetworkpolicies.policy.networking.k8s.io",
			"policy.networking.k8s.io", "ClusterNetworkPolicy", "v1alpha2",
			[]string{"Accept", "Deny", "Pass"}},
		{"crd-weirclusternetworkpolicies.yaml", "weirclusternetworkpolicies.weir.io",
			"weir.io", "WeirClusterNetworkPolicy", "v1alpha1",
			[]string{"Accept", "Deny", "Pass", "Reject", "Log"}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			crd := readCRD(t, tc.file)
			if crd.Name != tc.name || crd.Spec.Group != tc.group || crd.Spec.Names.Kind != tc.kind ||
				crd.Spec.Scope != apiextensionsv1.ClusterScoped {
				t.Fatalf("%s: %s (group %s, kind %s, scope %s), want %s, cluster-scoped",
					tc.file, crd.Name, crd.Spec.Group, crd.Spec.Names.Kind, crd.Spec.Scope, tc.name)
			}
			if len(crd.Spec.Versions) != 1 {
				t.Fatalf("%s: %d versions, want only %s", tc.file, len(crd.Spec.Versions), tc.version)
			}
			v := crd.Spec.Versions[0]
			if v.Name != tc.version || !v.Served || !v.Storage || v.Subresources == nil || v.Subresources.Status == nil {
				t.Fatalf("%s: version %s (served %v, storage %v), want %s served and stored with a status subresource",
					tc.file, v.Name, v.Served, v.Storage, tc.version)
			}
			spec := v.Schema.OpenAPIV3Schema.Properties["spec"]
			for _, dir := range []string{"ingress", "egress"} {
				if got := actionEnum(spec, dir); !slices.Equal(got, tc.actions) {
					t.Errorf("%s: %s actions %v, want %v", tc.file, dir, got, tc.actions)
				}
				// Weir's rules take HTTP rules (conditional rules), on
				// single TCP port numbers only; upstream's none.
				rule := spec.Properties[dir].Items.Schema
				http, ok := rule.Properties["http"]
				if wantHTTP := tc.group == "weir.io"; ok != wantHTTP {
					t.Errorf("%s: %s rules take http: %v, want %v", tc.file, dir, ok, wantHTTP)
				} else if ok && (http.MaxItems == nil || *http.MaxItems != 64 || !slices.ContainsFunc(rule.XValidations,
					func(v apiextensionsv1.ValidationRule) bool { return strings.Contains(v.Message, "http rules need") })) {
					t.Errorf("%s: %s http: at most %v rules, rules %v; want 64 and a rule asking for TCP port numbers", tc.file, dir, http.MaxItems, rule.XValidations)
				}
			}
		})
	}
}

// TestUpstreamCRDKeepsAPIApproval: the API server refuses a CRD in a
// *.k8s.io group without the approval annotation, which controller-gen on
// the upstream types would not write.
func TestUpstreamCRDKeepsAPIApproval(t *testing.T) {
	crd := readCRD(t, "crd-clusternetworkpolicies.yaml")
	if crd.Annotations[apiextensionsv1.KubeAPIApprovedAnnotation] == "" {
		t.Fatalf("annotations %v: no %s", crd.Annotations, apiextensionsv1.KubeAPIApprovedAnnotation)
	}
}

func readCRD(t *testing.T, file string) apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	b, err := Manifests.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(b, &crd); err != nil {
		t.Fatalf("%s does not decode strictly as a CustomResourceDefinition: %v", file, err)
	}
	return crd
}

// actionEnum is the enum of spec.<dir>[].action.
func actionEnum(spec apiextensionsv1.JSONSchemaProps, dir string) []string {
	rules, ok := spec.Properties[dir]
	if !ok || rules.Items == nil || rules.Items.Schema == nil {
		return nil
	}
	var out []string
	for _, v := range rules.Items.Schema.Properties["action"].Enum {
		var s string
		if json.Unmarshal(v.Raw, &s) != nil {
			s = string(v.Raw) // not a string: shown as is, and unequal
		}
		out = append(out, s)
	}
	return out
}

// TestWeirNetworkPolicyCRD: the namespaced kind with HTTP rules, one
// served storage version with a status subresource, its ports carrying at
// most 64 rules each (a set the kernel holds), and in the chart, the same
// file: the agent watches the kind and enforces its ingress HTTP rules,
// and its caches never sync on a cluster without the kind.
func TestWeirNetworkPolicyCRD(t *testing.T) {
	const file = "crd-weirnetworkpolicies.yaml"
	crd := readCRD(t, file)
	if crd.Name != "weirnetworkpolicies.weir.io" || crd.Spec.Scope != apiextensionsv1.NamespaceScoped || crd.Spec.Names.Kind != "WeirNetworkPolicy" {
		t.Fatalf("%s: %s, scope %s, kind %s", file, crd.Name, crd.Spec.Scope, crd.Spec.Names.Kind)
	}
	if len(crd.Spec.Versions) != 1 {
		t.Fatalf("%s: %d versions, want only v1alpha1", file, len(crd.Spec.Versions))
	}
	v := crd.Spec.Versions[0]
	if v.Name != "v1alpha1" || !v.Served || !v.Storage || v.Subresources == nil || v.Subresources.Status == nil {
		t.Fatalf("%s: version %s (served %v, storage %v), want v1alpha1 served and stored with a status subresource",
			file, v.Name, v.Served, v.Storage)
	}
	spec := v.Schema.OpenAPIV3Schema.Properties["spec"]
	for _, dir := range []string{"ingress", "egress"} {
		port := spec.Properties[dir].Items.Schema.Properties["ports"].Items.Schema
		http, ok := port.Properties["http"]
		if !ok || http.MaxItems == nil || *http.MaxItems != 64 {
			t.Errorf("%s ports: http %+v, want at most 64 rules", dir, http.MaxItems)
		}
		if _, ok := port.Properties["port"]; !ok {
			t.Errorf("%s ports: no port field (NetworkPolicyPort inline)", dir)
		}
	}
	want, err := Manifests.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Chart.ReadFile("helm/weir/crds/weirnetworkpolicies.yaml")
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the chart does not install %s as generated (%v): run go generate ./deploy", file, err)
	}
}

// TestCRDsPassTheAPIServersValidation runs every CRD the chart installs
// through the API server's own validation of a CustomResourceDefinition,
// CEL cost estimates included: a CRD whose rules an API server deems too
// costly (Gateway API's path rules under a policy's nested lists were)
// is refused at install, which no schema test sees.
func TestCRDsPassTheAPIServersValidation(t *testing.T) {
	for _, file := range []string{"crds.yaml", "crd-clusternetworkpolicies.yaml", "crd-weirclusternetworkpolicies.yaml", "crd-weirnetworkpolicies.yaml"} {
		t.Run(file, func(t *testing.T) {
			crd := readCRD(t, file)
			apiextensionsv1.SetObjectDefaults_CustomResourceDefinition(&crd)
			var internal apiextensions.CustomResourceDefinition
			if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(&crd, &internal, nil); err != nil {
				t.Fatal(err)
			}
			if errs := validation.ValidateCustomResourceDefinition(context.Background(), &internal); len(errs) > 0 {
				t.Fatalf("the API server would refuse %s: %v", file, errs.ToAggregate())
			}
		})
	}
}

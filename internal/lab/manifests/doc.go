// Package manifests holds the cluster add-ons a Kubernetes lab installs
// (cluster DNS, the demo app), embedded in the weir binary.
package manifests

import "embed"

// FS holds the YAML files of this directory.
//
//go:embed *.yaml
var FS embed.FS

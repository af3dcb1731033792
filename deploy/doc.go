// Package deploy holds the manifests that install Weir on a cluster, embedded
// so the lab applies exactly what an operator would.
package deploy

import "embed"

// Manifests are the YAML files of this directory.
//
//go:embed *.yaml *.tmpl
var Manifests embed.FS

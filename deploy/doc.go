// Package deploy holds what installs Weir on a cluster: the Helm chart
// (helm/weir), the CRDs it installs, generated here and copied into the
// chart, and deploy/weir.yaml, the chart rendered with its defaults for
// clusters without Helm. Both are embedded, so the lab installs exactly
// what an operator would.
package deploy

import "embed"

// Manifests are the generated CRDs of this directory.
//
//go:embed *.yaml
var Manifests embed.FS

// Chart is the Helm chart, rooted at helm/weir.
//
//go:embed all:helm/weir
var Chart embed.FS

// ChartDir is the chart's directory in Chart.
const ChartDir = "helm/weir"

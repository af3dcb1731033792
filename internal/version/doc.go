// Package version says which Weir a binary is: the release it was built
// as, the commit and time of its source, and the Go toolchain. Every
// binary (weir, weir-agent, weir-cni) reports the same Info, so an
// operator can tell that the CLI, the agents and the plugin on a node
// are one build, and the image tag and the Helm chart's appVersion carry
// the same Version.
package version

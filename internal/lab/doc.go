// Package lab builds multi-node Weir clusters on one machine out of network
// namespaces: an underlay bridge, N node namespaces each running its own
// weir-agent, an outside host, and pods attached through libcni exactly as
// a container runtime attaches them. Tests, the demo and the benchmarks all
// use it; Down removes everything Up made, found again by name and PID.
package lab

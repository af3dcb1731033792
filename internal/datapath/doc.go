// Package datapath is the only part of Weir that touches the kernel: it
// loads and pins the eBPF programs and maps built from ../../bpf, attaches
// them with tcx links, plumbs pod veths, routes and neighbours through
// netlink, and sets the node's sysctls and masquerade rule.
//
// Everything above this package (the agent, the CNI plugin, the lab) speaks
// in plain Go values: addresses as netip.Addr, prefixes as netip.Prefix,
// endpoints as EndpointSpec. The BPF-facing layouts are converted here.
package datapath

// Package connectivity is `weir connectivity test`: it checks a live
// cluster end to end from its API server alone. It deploys probe pods
// (the agent's own image running `weir-agent probe`, so nothing else is
// pulled) on two nodes in a namespace of its own, makes every kind of
// connection Weir carries (pod to pod on one node and across nodes, TCP
// and UDP, pod to a Service by ClusterIP and by DNS name, pod to node,
// node to pod, pod to outside when given a target, DNS), then puts a
// NetworkPolicy and a ClusterNetworkPolicy in force and checks that each
// denies what it should and allows what it should. Each check's deciding
// rule comes from the flows of the agent that judged it. Everything it
// made is removed at the end, also when interrupted.
//
// probe.go is the probe itself (server and one-shot client), run by the
// weir-agent binary inside the pods.
package connectivity

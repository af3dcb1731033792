// Package cni is the weir-cni plugin: it turns CNI ADD, DEL, CHECK, GC and
// STATUS into calls on the node agent's local API and the agent's answers
// into CNI results and errors. It holds no state and touches no kernel
// object itself; the agent does both.
package cni

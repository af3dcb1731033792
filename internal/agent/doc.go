// Package agent is the node agent: it owns the node's IPAM and datapath,
// serves the local API the CNI plugin calls, and keeps kernel state and
// leases consistent across failures and restarts.
//
// Every ADD is a sequence of datapath steps after an address lease; any
// failure rolls back everything before it with the same idempotent
// teardown DEL uses, so a failed ADD leaves nothing behind.
package agent

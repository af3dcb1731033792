// Package flowstore keeps a node's flows on disk, aggregated and bounded in
// size, so that a node's history survives an agent restart.
//
// Flows are aggregated in memory for a window (five seconds by default):
// flows with the same parties, destination port, verdict and rule become
// one record with a count, their first and last time, and the source port
// dropped, since an ephemeral port would give every connection its own
// record. At the end of each window its records are appended, as JSON
// lines, to the active segment: a file named by a sequence number that
// only grows. A segment that reaches its size is closed and the next
// window starts another; the oldest segments are deleted whenever the
// total passes the store's bound.
//
// Adding a flow is a map update under a mutex and never touches the disk,
// so the agent can record every new connection and every drop. A window is
// written with one write call and is not synced: a crash of the agent
// loses at most the window in memory, as the kernel still holds what was
// written. A power loss may lose more; segments are synced when they are
// closed. A write cut short leaves a torn last line, which readers skip.
//
// The package is pure Go and needs no privileges.
package flowstore

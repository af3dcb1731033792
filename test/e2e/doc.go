// Package e2e holds Weir's end-to-end tests: real weir-agent processes in
// node namespaces, the real weir-cni binary driven through libcni, and real
// packets across the lab. They need root and build the binaries themselves.
package e2e

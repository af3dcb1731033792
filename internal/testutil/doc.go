// Package testutil holds helpers shared by Weir's privileged tests:
// requirement checks that fail instead of skipping under CI=true, throwaway
// network namespaces and bpffs directories that clean themselves up.
package testutil

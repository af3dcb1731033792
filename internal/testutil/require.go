package testutil

import (
	"os"
	"testing"
)

// InCI reports whether the tests run under CI (CI=true), where a missing
// privilege or kernel feature is a failure, never a skip.
func InCI() bool { return os.Getenv("CI") == "true" }

// Unavailable skips the test outside CI and fails it in CI.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("CI=true and a requirement is missing: "+format, args...)
	}
	t.Skipf(format, args...)
}

// RequireRoot stops the test unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "needs root (run the privileged tests with sudo or as root)")
	}
}

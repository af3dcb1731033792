package datapath

import (
	"testing"

	"github.com/weirnet/weir/internal/policy"
)

// TestHTTPRestrictedAllowIsClosed: until the datapath reads requests, an
// allow that HTTP rules restrict must not reach the policy map as an
// allow, or the connection would be opened whole; with a kernel set it
// is written as an allow restricted to that set.
func TestHTTPRestrictedAllowIsClosed(t *testing.T) {
	if got := policyEntry(policy.Entry{Allow: 7}, 0); got.Allow != 7 || got.Http != 0 {
		t.Fatalf("plain allow written as %d, want 7", got.Allow)
	}
	e := policy.Entry{Allow: 7, HTTP: 1}
	e.Tier[policy.TierAdmin] = policy.Match{Rule: 3, Rank: 1, Action: policy.ActionDeny}
	if got := policyEntry(e, 9); got.Allow != 7 || got.Http != 9 {
		t.Fatalf("HTTP-restricted allow with kernel set 9 written as %+v", got)
	}
	got := policyEntry(e, 0)
	if got.Allow != 0 {
		t.Fatalf("HTTP-restricted allow written as allow %d, want 0 (closed)", got.Allow)
	}
	if got.Tier[policy.TierAdmin].Rule != 3 {
		t.Fatalf("the entry's tier rules were dropped: %+v", got)
	}
}

package version

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestGetNamesTheToolchainAndPlatform(t *testing.T) {
	i := Get()
	if i.Version != Version || i.GoVersion != runtime.Version() || i.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Fatalf("Get() = %+v", i)
	}
}

func TestStringSaysWhichSource(t *testing.T) {
	at := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		info Info
		want string
	}{
		{Info{Version: "1.2.3", Commit: "0123456789abcdef", CommitTime: at, GoVersion: "go1.25.0", Platform: "linux/arm64"},
			"1.2.3 (commit 0123456789ab, 2026-11-27T12:00:00Z, go1.25.0 linux/arm64)"},
		{Info{Version: "1.2.3", Commit: "0123456789abcdef", Modified: true, GoVersion: "go1.25.0", Platform: "linux/amd64"},
			"1.2.3 (commit 0123456789ab, modified, go1.25.0 linux/amd64)"},
		{Info{Version: "1.2.3", GoVersion: "go1.25.0", Platform: "linux/amd64"}, "1.2.3 (commit unknown, go1.25.0 linux/amd64)"},
	} {
		if got := c.info.String(); got != c.want {
			t.Errorf("%+v.String() = %q, want %q", c.info, got, c.want)
		}
	}
	if !strings.HasPrefix(Get().String(), Version+" (") {
		t.Errorf("Get().String() = %q", Get().String())
	}
}

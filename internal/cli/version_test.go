package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/version"
)

// serveVersion answers GET /v1/version on a unix socket in dir, as an
// agent of build info would.
func serveVersion(t *testing.T, dir string, info version.Info) string {
	t.Helper()
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+api.PathVersion, func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(info)
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return sock
}

// TestVersionsOfEveryPart: the CLI's own build, each agent's (one not
// running is reported, not fatal), the plugin's from what it prints
// without CNI_COMMAND, and a note when the builds differ.
func TestVersionsOfEveryPart(t *testing.T) {
	dir := t.TempDir()
	other := version.Get()
	other.Commit = "feedfacefeedfacefeedface"
	sock := serveVersion(t, dir, other)
	plugin := filepath.Join(dir, "weir-cni")
	about, _ := json.Marshal(version.Get())
	script := "#!/bin/sh\n[ -z \"$CNI_COMMAND\" ] || exit 3\necho 'weir-cni: test' >&2\necho '" + string(about) + "' >&2\necho 'CNI protocol versions supported: 1.1.0' >&2\n"
	if err := os.WriteFile(plugin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	v := collectVersions(context.Background(), []agentConn{{node: "n1", where: sock, client: api.NewClient(sock)},
		{node: "n2", where: filepath.Join(dir, "gone.sock"), client: api.NewClient(filepath.Join(dir, "gone.sock"))}}, plugin, false)
	if v.CLI != version.Get() || len(v.Agents) != 2 || v.Agents[0].Info == nil || v.Agents[0].Info.Commit != other.Commit ||
		v.Agents[1].Info != nil || v.Agents[1].Error == "" || v.CNI.Info == nil || *v.CNI.Info != version.Get() || v.Kernel.Release == "" {
		t.Fatalf("collected %+v", v)
	}
	var out bytes.Buffer
	if err := printVersions(v, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"weir (CLI)", "n1 " + sock, "commit feedfacefeed", "n2", "not reachable", "weir-cni", plugin,
		"kernel", "not all one build"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	// A plugin that is not weir-cni's build says so.
	if err := os.WriteFile(plugin, []byte("#!/bin/sh\necho 'some other plugin' >&2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if b := cniVersion(context.Background(), plugin); b.Info != nil || !strings.Contains(b.Error, "some other plugin") {
		t.Errorf("another plugin read as %+v", b)
	}
}

package datapath

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSysctlDirWritesBelowItsRoot: the node's and a host veth's sysctls
// go under the directory the agent was given (the chart's bind of the
// host's /proc/sys/net), a value already set is left alone, and IPv6
// keys are skipped where the kernel has no IPv6.
func TestSysctlDirWritesBelowItsRoot(t *testing.T) {
	root := t.TempDir()
	for _, f := range []string{"net/ipv4/ip_forward", "net/ipv4/conf/all/rp_filter", "net/ipv4/conf/default/rp_filter",
		"net/ipv4/conf/weirx/accept_redirects", "net/ipv4/conf/weirx/send_redirects", "net/ipv4/conf/weirx/accept_source_route"} {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d := sysctlDir(root)
	if err := d.setNodeSysctls(); err != nil {
		t.Fatal(err)
	}
	if err := d.setHostVethSysctls("weirx"); err != nil {
		t.Fatalf("a node without IPv6: %v", err)
	}
	for f, want := range map[string]string{
		"net/ipv4/ip_forward": "1\n", "net/ipv4/conf/all/rp_filter": "0", "net/ipv4/conf/default/rp_filter": "0",
		"net/ipv4/conf/weirx/accept_redirects": "0", "net/ipv4/conf/weirx/send_redirects": "0", "net/ipv4/conf/weirx/accept_source_route": "0",
	} {
		if b, err := os.ReadFile(filepath.Join(root, f)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", f, b, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "net/ipv6")); !os.IsNotExist(err) {
		t.Errorf("IPv6 keys written on a node without IPv6: %v", err)
	}
}

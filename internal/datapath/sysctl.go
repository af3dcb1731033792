package datapath

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// nodeSysctls are what pod networking needs from the node's namespace.
// Strict reverse-path filtering would drop replies that come back through
// a different device than the one the stack would route them out of (the
// overlay versus a veth), so it is turned off as Cilium does.
var nodeSysctls = map[string]string{
	"net/ipv4/ip_forward":             "1",
	"net/ipv4/conf/all/rp_filter":     "0",
	"net/ipv4/conf/default/rp_filter": "0",
}

// setNodeSysctls writes nodeSysctls for the calling thread's namespace.
func setNodeSysctls() error {
	for k, v := range nodeSysctls {
		if err := writeSysctl(k, v); err != nil {
			return err
		}
	}
	return nil
}

func writeSysctl(name, value string) error {
	p := filepath.Join("/proc/sys", name)
	if cur, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(cur)) == value {
		return nil
	}
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("set sysctl %s=%s: %w", strings.ReplaceAll(name, "/", "."), value, err)
	}
	return nil
}

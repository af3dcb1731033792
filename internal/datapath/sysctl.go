package datapath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
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

// DefaultSysctlDir is where the kernel's sysctls are. A container that
// is not privileged sees /proc/sys read-only (the runtime makes it so),
// so the chart binds the host's /proc/sys/net elsewhere and names that
// place (NodeConfig.SysctlDir). Network sysctls under either resolve in
// the network namespace of the thread that opens them.
const DefaultSysctlDir = "/proc/sys"

// sysctlDir is a directory laid out as /proc/sys (at least its net/).
type sysctlDir string

// setNodeSysctls writes nodeSysctls for the calling thread's namespace.
func (d sysctlDir) setNodeSysctls() error {
	for k, v := range nodeSysctls {
		if err := d.write(k, v); err != nil {
			return err
		}
	}
	return nil
}

// hostVethSysctls harden the node side of a pod's veth: a pod is never a
// router of the node's, so its router advertisements and redirects must
// not configure the node's addresses or routes.
var hostVethSysctls = []struct{ key, value string }{
	{"net/ipv6/conf/%s/accept_ra", "0"},
	{"net/ipv6/conf/%s/accept_redirects", "0"},
	{"net/ipv4/conf/%s/accept_redirects", "0"},
	{"net/ipv4/conf/%s/send_redirects", "0"},
	{"net/ipv4/conf/%s/accept_source_route", "0"},
}

// setHostVethSysctls writes hostVethSysctls for ifName in the calling
// thread's namespace. A node without IPv6 has no IPv6 keys to set.
func (d sysctlDir) setHostVethSysctls(ifName string) error {
	for _, s := range hostVethSysctls {
		name := fmt.Sprintf(s.key, ifName)
		if strings.HasPrefix(name, "net/ipv6/") {
			if _, err := os.Stat(filepath.Join(string(d), name)); errors.Is(err, fs.ErrNotExist) {
				continue
			}
		}
		if err := d.write(name, s.value); err != nil {
			return err
		}
	}
	return nil
}

func (d sysctlDir) write(name, value string) error {
	p := filepath.Join(string(d), name)
	if cur, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(cur)) == value {
		return nil
	}
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		if errors.Is(err, unix.EROFS) {
			return fmt.Errorf("set sysctl %s=%s: %w (%s is read-only, as /proc/sys is in a container that is not privileged: bind the host's /proc/sys/net elsewhere and pass that place's parent as --sysctl-dir)",
				strings.ReplaceAll(name, "/", "."), value, err, d)
		}
		return fmt.Errorf("set sysctl %s=%s: %w", strings.ReplaceAll(name, "/", "."), value, err)
	}
	return nil
}

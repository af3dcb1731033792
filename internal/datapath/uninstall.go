package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// UninstallPaths are where an agent and its plugin wrote on a node; empty
// paths are left alone. Directories are emptied of what Weir puts there
// only, and removed when that leaves them empty: a pin or state directory
// set to a shared one (/sys/fs/bpf, /var/lib) loses nothing of others.
type UninstallPaths struct {
	PinDir   string // the agent's --bpf-pin-dir
	StateDir string // --state-dir: IPAM leases, node state, flows
	Socket   string // --socket (its directory goes if left empty)
	// CgroupRoot is where the agent mounts cgroup2 when the node has none
	// mounted (DefaultCgroupRoot): unmounted if it is mounted there.
	CgroupRoot string
	CNIConf    string // the conflist the agent wrote
	CNIBinary  string // the plugin install-cni copied
}

// ErrSharedPinDir: the pin directory given is a BPF filesystem's root,
// shared with every other user of bpffs; Weir's pins are never there.
var ErrSharedPinDir = errors.New("the pin directory is the root of a BPF filesystem, not Weir's own directory")

// weirPin says whether a pin directory entry is Weir's: its maps, and the
// directories of its link pins.
func weirPin(name string) bool {
	switch name {
	case "links", "links-egress", "cgroup", "devices":
		return true
	}
	return strings.HasPrefix(name, "weir_")
}

// weirStateFile says whether a state directory entry is Weir's: the IPAM
// leases and the node's state (with their temporary and lock files).
func weirStateFile(name string) bool {
	return strings.HasPrefix(name, "ipam.json") || strings.HasPrefix(name, "node.json")
}

// weirState says which entries of a state directory are Weir's: its
// files, and its flow store when the directory is Weir's (holds one of
// its files), since "flows" alone could be anyone's.
func weirState(dir string) func(string) bool {
	entries, _ := os.ReadDir(dir)
	ours := false
	for _, e := range entries {
		ours = ours || weirStateFile(e.Name())
	}
	return func(name string) bool { return weirStateFile(name) || (ours && name == "flows") }
}

// Uninstall removes from this node (the caller's network namespace and
// mounts) everything Weir put there: pod veths (their pods lose their
// network, as with any CNI removed under them), routes, the overlay
// device, the masquerade table, every pin (which detaches the programs:
// their links are pinned, nothing else holds them once the agent is
// gone), Weir's cgroup2 mount, the CNI config and plugin, and the
// agent's state and socket. It goes on past failures, and
// returns what it removed and every failure. The agent must be stopped
// first, or it would put back what this removes.
func Uninstall(p UninstallPaths) (removed []string, _ error) {
	if p.PinDir != "" {
		if root, err := isFSRoot(p.PinDir, unix.BPF_FS_MAGIC); err != nil {
			return nil, err
		} else if root {
			return nil, fmt.Errorf("%s: %w (see the agent's --bpf-pin-dir)", p.PinDir, ErrSharedPinDir)
		}
	}
	var errs []error
	note := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", what, err))
			return
		}
		removed = append(removed, what)
	}
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		name := l.Attrs().Name
		_, veth := l.(*netlink.Veth)
		if (veth && IsHostIfName(name)) || name == OverlayDevice {
			note("link "+name, ignoreLinkGone(netlink.LinkDel(l)))
		}
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: routeProtocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		errs = append(errs, fmt.Errorf("list Weir's routes: %w", err))
	}
	for _, r := range routes {
		err := netlink.RouteDel(&r)
		if errors.Is(err, unix.ESRCH) {
			continue // gone with its device
		}
		note("route "+r.Dst.String(), err)
	}
	if present, err := masqueradePresent(); err != nil {
		errs = append(errs, err)
	} else if present {
		note("nftables table ip "+masqTable, removeMasquerade())
	}
	if p.CgroupRoot != "" && !systemCgroupMount(p.CgroupRoot) {
		if mounted, err := isFSRoot(p.CgroupRoot, unix.CGROUP2_SUPER_MAGIC); err != nil {
			errs = append(errs, err)
		} else if mounted {
			// Detached even if busy: no directory below is walked into
			// while it is mounted (the removals below would descend into
			// the cgroup hierarchy).
			note("cgroup2 mount "+p.CgroupRoot, unix.Unmount(p.CgroupRoot, unix.MNT_DETACH))
		}
		if removeIfEmpty(p.CgroupRoot) {
			removed = append(removed, p.CgroupRoot)
		}
	}
	for _, f := range []struct {
		path   string
		socket bool
	}{{p.CNIConf, false}, {p.CNIBinary, false}, {p.Socket, true}} {
		if f.path == "" {
			continue
		}
		fi, err := os.Lstat(f.path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err == nil && f.socket && fi.Mode()&os.ModeSocket == 0 {
			errs = append(errs, fmt.Errorf("%s is no socket: left alone (check the agent's --socket)", f.path))
			continue
		}
		note(f.path, os.Remove(f.path))
	}
	for _, d := range []struct {
		dir   string
		owned func(string) bool
	}{{p.PinDir, weirPin}, {p.StateDir, weirState(p.StateDir)}} {
		if d.dir == "" {
			continue
		}
		entries, err := os.ReadDir(d.dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("list %s: %w", d.dir, err))
			continue
		}
		n := 0
		for _, e := range entries {
			if !d.owned(e.Name()) {
				continue
			}
			if err := os.RemoveAll(filepath.Join(d.dir, e.Name())); err != nil {
				errs = append(errs, fmt.Errorf("remove %s: %w", filepath.Join(d.dir, e.Name()), err))
				continue
			}
			n++
		}
		if n > 0 {
			removed = append(removed, fmt.Sprintf("%d entries of %s", n, d.dir))
		}
	}
	if p.PinDir != "" {
		errs = append(errs, waitDetached(5*time.Second))
	}
	for _, dir := range []string{p.PinDir, p.StateDir, socketDir(p.Socket)} {
		if dir == "" {
			continue
		}
		if removeIfEmpty(dir) {
			removed = append(removed, dir)
		} else if isMountPoint(dir) {
			// A host directory mounted into the container running this:
			// it cannot go from here, and stays empty of Weir.
			removed = append(removed, dir+" emptied (a mount point here: the directory itself stays)")
		}
	}
	return removed, errors.Join(errs...)
}

func ignoreLinkGone(err error) error {
	if err != nil && isLinkNotFound(err) {
		return nil
	}
	return err
}

// masqueradePresent says whether the masquerade table exists.
func masqueradePresent() (bool, error) {
	c, err := nftables.New()
	if err != nil {
		return false, fmt.Errorf("nftables connection: %w", err)
	}
	defer c.CloseLasting()
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return false, fmt.Errorf("list nftables tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == masqTable {
			return true, nil
		}
	}
	return false, nil
}

// systemCgroupMount says whether dir is the system's cgroup mount or
// below it, which an --cgroup-root may name but Weir never unmounts.
func systemCgroupMount(dir string) bool {
	const system = "/sys/fs/cgroup"
	dir = filepath.Clean(dir)
	return dir == system || strings.HasPrefix(dir, system+"/")
}

// tcxProgramNames are Weir's programs attached to devices with tcx.
var tcxProgramNames = map[string]bool{"from_container": true, "to_container": true, "from_overlay": true,
	"to_overlay": true, "from_netdev": true, "to_netdev": true}

// waitDetached waits until no device of this namespace has a program of
// Weir attached. An unpinned link is released by the kernel a moment
// later (after an RCU grace period), not at once; one still attached
// after timeout is held open by a process: an agent still running.
func waitDetached(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		attached, err := attachedPrograms()
		if err != nil || len(attached) == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("programs still attached %v after their pins went: %s (held open by a process: is an agent still running?)",
				timeout, strings.Join(attached, ", "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// attachedPrograms lists Weir's tcx programs attached in this namespace,
// as "device direction program".
func attachedPrograms() ([]string, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var out []string
	for _, l := range links {
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: at})
			if err != nil {
				continue // a device without tcx
			}
			for _, pr := range res.Programs {
				p, err := ebpf.NewProgramFromID(pr.ID)
				if err != nil {
					continue // released meanwhile
				}
				info, err := p.Info()
				p.Close()
				if err == nil && tcxProgramNames[info.Name] {
					out = append(out, fmt.Sprintf("%s %v %s", l.Attrs().Name, at, info.Name))
				}
			}
		}
	}
	return out, nil
}

// isFSRoot says whether dir is the root of a mount of the filesystem
// type magic (a statfs f_type): of that type, and its parent is not.
func isFSRoot(dir string, magic int64) (bool, error) {
	var st, parent unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("statfs %s: %w", dir, err)
	}
	if st.Type != magic {
		return false, nil
	}
	if err := unix.Statfs(filepath.Dir(dir), &parent); err != nil {
		return false, fmt.Errorf("statfs %s: %w", filepath.Dir(dir), err)
	}
	return parent.Type != magic || filepath.Clean(dir) == "/", nil
}

// isMountPoint says whether dir is mounted on (another device than its
// parent's).
func isMountPoint(dir string) bool {
	var st, parent unix.Stat_t
	if unix.Stat(dir, &st) != nil || unix.Stat(filepath.Dir(dir), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

// socketDir is the socket's directory, or empty for no socket.
func socketDir(socket string) string {
	if socket == "" {
		return ""
	}
	return filepath.Dir(socket)
}

// removeIfEmpty removes dir when nothing is left in it (a mount point, or
// a directory holding what is not Weir's, stays) and says whether it did.
func removeIfEmpty(dir string) bool {
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) > 0 {
		return false
	}
	return os.Remove(dir) == nil
}

package main

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/datapath/bpffs"
)

// newMountFSCommand is `weir-agent mount-fs`, the chart's privileged init
// container: it makes the two mounts an agent that is not privileged
// cannot make so that they reach the node. The BPF filesystem under the
// pin directory, which must outlive the agent's container (a mount made
// inside it would go, and the datapath's pins with it); and the machine's
// cgroup v2 hierarchy, mounted from the machine's cgroup namespace, which
// a privileged container shares and the agent's container does not.
func newMountFSCommand() *cobra.Command {
	var pinDir, cgroupRoot, configDir string
	cmd := &cobra.Command{
		Use:   "mount-fs",
		Short: "Mount bpffs under --bpf-pin-dir and the machine's cgroup2 at --cgroup-root, for an agent that is not privileged (run privileged, with Bidirectional mount propagation)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configDir != "" {
				// The agent's ConfigMap: its paths. Its other keys are the
				// agent's, not this command's.
				if _, err := applyConfigDir(cmd.Flags(), configDir); err != nil {
					return err
				}
			}
			if cgroupRoot == "" {
				return fmt.Errorf("--cgroup-root is empty: name where the agent finds the machine's cgroup2 (its --cgroup-root), e.g. %s", datapath.DefaultCgroupRoot)
			}
			out := cmd.OutOrStdout()
			mounted, err := bpffs.Ensure(filepath.Dir(pinDir))
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "bpffs for %s: %s\n", pinDir, mountedOrThere(mounted))
			if mounted, err = datapath.MountCgroup2(cgroupRoot); err != nil {
				return err
			}
			fmt.Fprintf(out, "cgroup2 (the machine's root) at %s: %s\n", cgroupRoot, mountedOrThere(mounted))
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&pinDir, "bpf-pin-dir", "/sys/fs/bpf/weir", "the agent's --bpf-pin-dir")
	fl.StringVar(&cgroupRoot, "cgroup-root", datapath.DefaultCgroupRoot, "the agent's --cgroup-root")
	fl.StringVar(&configDir, "config-dir", "", "the agent's --config-dir (its mounted ConfigMap), for the paths above")
	return cmd
}

func mountedOrThere(mounted bool) string {
	if mounted {
		return "mounted"
	}
	return "already mounted"
}

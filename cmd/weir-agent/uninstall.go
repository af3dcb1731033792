package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/cni"
	"github.com/weirnet/weir/internal/datapath"
)

// newUninstallCommand is `weir-agent uninstall`: remove everything Weir
// put on this node, after its agent stopped (helm uninstall, or the
// DaemonSet deleted). `weir uninstall` runs it on every node.
func newUninstallCommand() *cobra.Command {
	var socket, stateDir, pinDir, cniConfDir, cniBinDir, configDir, cgroupRoot string
	var force bool
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Remove Weir from this node: pod veths, routes, the overlay device, the masquerade table, programs and pins, CNI config and plugin, state",
		Long: "Run as root on a node whose agent has stopped. Pods still running on the node lose their network\n" +
			"(their veths go): drain the node or delete them, and let the next CNI give them new ones.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configDir != "" {
				// The agent's ConfigMap: its paths, as the agent read them.
				// Its other keys are the agent's, not this command's.
				if _, err := applyConfigDir(cmd.Flags(), configDir); err != nil {
					return err
				}
			}
			if !force {
				ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Second)
				err := api.NewClient(socket).Health(ctx)
				cancel()
				if err == nil {
					return fmt.Errorf("the agent at %s still runs and would put back what uninstall removes: stop it first (helm uninstall, or delete the weir-agent DaemonSet), or pass --force", socket)
				}
			}
			removed, err := datapath.Uninstall(datapath.UninstallPaths{
				PinDir: pinDir, StateDir: stateDir, Socket: socket, CgroupRoot: cgroupRoot,
				CNIConf: filepath.Join(cniConfDir, cni.ConfListName), CNIBinary: filepath.Join(cniBinDir, "weir-cni"),
			})
			// Other CNIs' configs the agent set aside come back, once
			// Weir's own is gone and if their plugins are still there.
			var back cni.Restored
			if err == nil {
				var rerr error
				back, rerr = cni.RestoreOthers(cniConfDir, cniBinDir)
				err = rerr
			}
			for _, d := range back.Removed {
				removed = append(removed, filepath.Join(cniConfDir, d)+" (the set-aside copy of a config written anew since)")
			}
			out := cmd.OutOrStdout()
			for _, r := range removed {
				fmt.Fprintln(out, "removed", r)
			}
			for _, r := range back.Restored {
				fmt.Fprintln(out, "restored", filepath.Join(cniConfDir, r), "(another CNI's config, set aside by the agent)")
			}
			for _, k := range back.Kept {
				fmt.Fprintln(out, "kept", filepath.Join(cniConfDir, k), "set aside: a plugin it calls is not in", cniBinDir, "(rename it back once its CNI is installed again)")
			}
			restored := back.Restored
			if len(removed) == 0 && len(restored) == 0 && err == nil {
				fmt.Fprintln(out, "nothing of Weir on this node")
			}
			if err != nil {
				return errors.Join(errors.New("some of Weir is still on this node"), err)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&socket, "socket", defaultSocket(), "the agent's socket (its directory goes too if that leaves it empty)")
	fl.StringVar(&stateDir, "state-dir", "/var/lib/weir", "the agent's --state-dir")
	fl.StringVar(&pinDir, "bpf-pin-dir", "/sys/fs/bpf/weir", "the agent's --bpf-pin-dir")
	fl.StringVar(&cgroupRoot, "cgroup-root", datapath.DefaultCgroupRoot, "the agent's --cgroup-root: unmounted if it is a cgroup2 mount (one Weir made)")
	fl.StringVar(&cniConfDir, "cni-conf-dir", "/etc/cni/net.d", "where the agent wrote "+cni.ConfListName)
	fl.StringVar(&cniBinDir, "cni-bin-dir", "/opt/cni/bin", "where install-cni put weir-cni")
	fl.StringVar(&configDir, "config-dir", "", "the agent's --config-dir (its mounted ConfigMap), for the paths above")
	fl.BoolVar(&force, "force", false, "remove even though the agent answers on --socket")
	return cmd
}

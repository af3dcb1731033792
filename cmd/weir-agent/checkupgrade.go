package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/weirnet/weir/internal/datapath"
)

// newCheckUpgradeCommand is `weir-agent check-upgrade`: whether this
// version's agent can take over, in place, the maps the running datapath
// pinned on this node. The chart runs it before helm upgrade replaces any
// agent (templates/upgrade-check.yaml), so an upgrade that cannot be done
// in place stops before it starts.
func newCheckUpgradeCommand() *cobra.Command {
	var pinDir, configDir string
	cmd := &cobra.Command{
		Use:   "check-upgrade",
		Short: "Check that this version can take over the eBPF maps pinned on this node in place (changes nothing)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configDir != "" {
				// The running release's ConfigMap: its pin directory.
				warnings, err := applyConfigDir(cmd.Flags(), configDir)
				if err != nil {
					return err
				}
				_ = warnings // keys of the agent's, not this command's
			}
			if err := datapath.CheckPins(pinDir); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "the maps pinned in %s can be taken over in place\n", pinDir)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&pinDir, "bpf-pin-dir", "/sys/fs/bpf/weir", "the running agent's --bpf-pin-dir")
	fl.StringVar(&configDir, "config-dir", "", "the agent's --config-dir (its mounted ConfigMap), for --bpf-pin-dir")
	return cmd
}

package cli

import (
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

// NewRootCommand is `weir`.
func NewRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "weir",
		Short:         "Weir: eBPF pod networking, policy and observability for Kubernetes",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(NewLabCommand(), NewStatusCommand(), NewObserveCommand(), NewPolicyCommand(), NewServiceCommand(),
		NewVersionCommand(), NewPreflightCommand(), NewImageCommand(), NewConnectivityCommand(), NewUninstallCommand())
	return root
}

// defaultBinDir is the directory of the running weir binary: weir-agent and
// weir-cni are built next to it.
func defaultBinDir() string {
	exe, err := os.Executable()
	if err != nil {
		return "bin"
	}
	return filepath.Dir(exe)
}

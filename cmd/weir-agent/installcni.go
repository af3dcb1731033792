package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
)

// newInstallCNICommand is `weir-agent install-cni`, the DaemonSet's init
// container: the plugin copied into the node's CNI bin directory.
func newInstallCNICommand() *cobra.Command {
	var from, to string
	cmd := &cobra.Command{
		Use:   "install-cni",
		Short: "Install weir-cni into the node's CNI bin directory (the agent DaemonSet's init container)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dst, err := installPlugin(from, to)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), "installed", dst)
			return err
		},
	}
	cmd.Flags().StringVar(&from, "from", "/usr/bin/weir-cni", "the plugin to install")
	cmd.Flags().StringVar(&to, "to", "/opt/cni/bin", "the node's CNI bin directory")
	return cmd
}

// installPlugin copies from into dir under its own name: written beside
// it, synced, then renamed over the old one, so a runtime never runs half
// a binary, and one running the old binary keeps it.
func installPlugin(from, dir string) (_ string, retErr error) {
	src, err := os.Open(from)
	if err != nil {
		return "", fmt.Errorf("install-cni: %w", err)
	}
	defer src.Close()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("install-cni: %w", err)
	}
	dst := filepath.Join(dir, filepath.Base(from))
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(from)+".new-")
	if err != nil {
		return "", fmt.Errorf("install-cni: %w", err)
	}
	defer func() {
		if retErr != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, src); err != nil {
		return "", fmt.Errorf("install-cni: copy %s: %w", from, err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		return "", fmt.Errorf("install-cni: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return "", fmt.Errorf("install-cni: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("install-cni: %w", err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("install-cni: %w", err)
	}
	return dst, nil
}

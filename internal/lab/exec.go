package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// nodeExec runs CNI plugins inside a node's network namespace, where a
// container runtime on that node would run them.
type nodeExec struct{ netns string }

var _ invoke.Exec = nodeExec{}

func (e nodeExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+e.netns, "--", pluginPath)
	cmd.Env = environ
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		var perr types.Error
		if json.Unmarshal(stdout.Bytes(), &perr) == nil && perr.Msg != "" {
			return nil, &perr
		}
		return nil, fmt.Errorf("plugin %s: %w: %s%s", pluginPath, err, stdout.String(), stderr.String())
	}
	return stdout.Bytes(), nil
}

func (nodeExec) FindInPath(plugin string, paths []string) (string, error) {
	return invoke.FindInPath(plugin, paths)
}

func (nodeExec) Decode(b []byte) (version.PluginInfo, error) {
	var d version.PluginDecoder
	return d.Decode(b)
}

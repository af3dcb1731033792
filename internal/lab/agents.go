package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// startAgent runs the node's weir-agent inside the node namespace. nsenter
// enters only the network namespace (ip netns exec would also remount /sys
// and hide bpffs and cgroups), then execs the agent, so the recorded PID
// is the agent's own. The agent gets its own session and outlives `weir lab up`.
func (st *State) startAgent(ctx context.Context, n *Node) error {
	if err := os.MkdirAll(filepath.Dir(n.Log), 0o755); err != nil {
		return err
	}
	logf, err := os.OpenFile(n.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{
		"--net=" + nsPath(n.NetNS), "--",
		filepath.Join(st.Config.BinDir, "weir-agent"),
		"--node-name", n.Name,
		"--mode", string(st.Config.Mode),
		"--underlay-dev", "eth0",
		"--node-ip", n.IP.String(),
		"--pod-cidr", n.PodCIDR.String(),
		"--cluster-cidr", st.Config.ClusterCIDR.String(),
		"--state-dir", n.StateDir,
		"--bpf-pin-dir", n.PinDir,
		"--socket", n.Socket,
		"--peers-file", filepath.Join(st.RunDir, "peers.json"),
	}
	cmd := exec.Command("nsenter", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start agent of %s: %w", n.Name, err)
	}
	n.AgentPID = cmd.Process.Pid
	// Reap the child if it exits while we are still around; Down signals by PID.
	go cmd.Wait()
	return waitHealthy(ctx, n.Client(), n.AgentPID, n.Log)
}

// RestartAgent stops a node's agent and starts a new one; the datapath
// keeps forwarding in between.
func (st *State) RestartAgent(ctx context.Context, node string) error {
	n, err := st.NodeByName(node)
	if err != nil {
		return err
	}
	if err := stopProcess(n.AgentPID, "weir-agent", 10*time.Second); err != nil {
		return err
	}
	if err := st.startAgent(ctx, n); err != nil {
		return err
	}
	return st.save()
}

// StopAgent stops a node's agent without restarting it.
func (st *State) StopAgent(node string) error {
	n, err := st.NodeByName(node)
	if err != nil {
		return err
	}
	return stopProcess(n.AgentPID, "weir-agent", 10*time.Second)
}

// StartAgent starts a stopped node agent.
func (st *State) StartAgent(ctx context.Context, node string) error {
	n, err := st.NodeByName(node)
	if err != nil {
		return err
	}
	if err := st.startAgent(ctx, n); err != nil {
		return err
	}
	return st.save()
}

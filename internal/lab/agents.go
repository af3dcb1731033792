package lab

import (
	"context"
	"path/filepath"
	"time"
)

// startAgent runs the node's weir-agent inside the node namespace
// (startProc); it outlives `weir lab up` and is stopped by its PID.
func (st *State) startAgent(ctx context.Context, n *Node) error {
	p, err := startProc(n.Name+"/weir-agent", n.NetNS, n.Log, []string{
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
	}, nil)
	if err != nil {
		return err
	}
	n.AgentPID = p.PID
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

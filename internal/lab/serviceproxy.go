package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
)

// SetServiceProxy switches a running Kubernetes lab between Weir's
// kube-proxy replacement (KubeProxyNone) and kube-proxy in nftables or
// iptables mode, on every node, so one cluster can measure each against
// the others (bench services). Going to kube-proxy, each agent restarts
// with --kube-proxy-replacement=false --socket-lb=false: Weir leaves every
// Service to kube-proxy, whose rules then see pods' ClusterIP connections
// too. Leaving a kube-proxy mode, kube-proxy is stopped and its rules
// removed (kube-proxy --cleanup), so none of them lingers in the path of
// the next mode's connections. It returns once every agent is healthy and
// every kube-proxy answers its /healthz, which it does after its first
// full sync of the Services.
//
// The lab's agents must be host processes (--agents host): a DaemonSet's
// would need a rollout for every switch.
func (st *State) SetServiceProxy(ctx context.Context, mode string) error {
	if st.Kube == nil {
		return errors.New("switching the Service proxy needs a Kubernetes lab (weir lab up --kubernetes)")
	}
	if st.Config.AgentMode != AgentHost {
		return fmt.Errorf("switching the Service proxy restarts the agents: lab %s runs them as a DaemonSet; bring it up with --agents %s", st.Config.Name, AgentHost)
	}
	switch mode {
	case KubeProxyNone, KubeProxyNFTables, KubeProxyIPTables:
	default:
		return fmt.Errorf("service proxy %q: want %s (Weir), %s or %s", mode, KubeProxyNone, KubeProxyNFTables, KubeProxyIPTables)
	}
	st.Config.KubeProxy = mode
	for i := range st.Nodes {
		if err := st.switchNodeProxy(ctx, &st.Nodes[i]); err != nil {
			return fmt.Errorf("node %s to %s: %w", st.Nodes[i].Name, mode, err)
		}
	}
	return st.save()
}

// switchNodeProxy does SetServiceProxy's work on one node: kube-proxy
// stopped and cleaned up, the agent restarted with the flags of the new
// mode, and kube-proxy started again in its new mode.
func (st *State) switchNodeProxy(ctx context.Context, n *Node) error {
	if err := st.removeKubeProxy(ctx, n); err != nil {
		return err
	}
	if err := st.restartAgentProxyFlags(ctx, n); err != nil {
		return err
	}
	// The old proxy's translations stay in conntrack for minutes (two in
	// TIME_WAIT): a new connection that reuses a source port would have
	// its replies matched to them and translated back to the old
	// ClusterIP, and stall.
	if err := inNS(n.NetNS, func() error { return netlink.ConntrackTableFlush(netlink.ConntrackTable) }); err != nil {
		return fmt.Errorf("flush conntrack: %w", err)
	}
	if st.replacesKubeProxy() {
		return nil
	}
	if err := st.startKubeProxy(n, st.kubePaths(n)); err != nil {
		return err
	}
	p, err := st.proc(n.Name + "/kube-proxy")
	if err != nil {
		return err
	}
	return waitKubeProxyHealthy(ctx, n, *p)
}

// removeKubeProxy stops the node's kube-proxy, if one runs, forgets it,
// and removes every rule a kube-proxy of any mode left in the node.
func (st *State) removeKubeProxy(ctx context.Context, n *Node) error {
	name := n.Name + "/kube-proxy"
	if p, err := st.proc(name); err == nil {
		if err := p.stop(10 * time.Second); err != nil {
			return err
		}
		st.Kube.Procs = slices.DeleteFunc(st.Kube.Procs, func(p Proc) bool { return p.Name == name })
	}
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+nsPath(n.NetNS), "--", st.KubeBin("kube-proxy"), "--cleanup", "--v=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kube-proxy --cleanup: %w: %s", err, out)
	}
	return nil
}

// restartAgentProxyFlags restarts the node's agent with the flags of the
// lab's Service proxy and records its new PID.
func (st *State) restartAgentProxyFlags(ctx context.Context, n *Node) error {
	p, err := st.proc(n.Name + "/weir-agent")
	if err != nil {
		return err
	}
	if err := p.stop(10 * time.Second); err != nil {
		return err
	}
	p.Argv = agentProxyArgs(p.Argv, st.replacesKubeProxy())
	np, err := startProc(p.Name, p.NetNS, p.Log, p.Argv, nil)
	if err != nil {
		return err
	}
	*p = np
	return waitHealthy(ctx, n.Client(), np.PID, np.Log)
}

// agentProxyArgs rewrites an agent's command line for a Service proxy:
// Weir's replacement, or every Service left to kube-proxy.
func agentProxyArgs(argv []string, replace bool) []string {
	out := slices.DeleteFunc(slices.Clone(argv), func(a string) bool {
		return strings.HasPrefix(a, "--kube-proxy-replacement=") || strings.HasPrefix(a, "--socket-lb=")
	})
	return append(out, "--kube-proxy-replacement="+strconv.FormatBool(replace), "--socket-lb="+strconv.FormatBool(replace))
}

// waitKubeProxyHealthy waits for the node's kube-proxy to answer 200 on
// its /healthz, which it does once it has programmed every Service.
func waitKubeProxyHealthy(ctx context.Context, n *Node, p Proc) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		code, err := kubeProxyHealthz(n)
		if err == nil && code == http.StatusOK {
			return nil
		}
		if !p.Alive() {
			return fmt.Errorf("kube-proxy exited; its log %s says:\n%s", p.Log, tail(p.Log, 20))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-proxy not healthy after 2 minutes (last: %d, %v); its log %s says:\n%s", code, err, p.Log, tail(p.Log, 20))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// kubeProxyHealthz asks the node's kube-proxy for its /healthz.
func kubeProxyHealthz(n *Node) (int, error) {
	return HTTPStatusIn(nsPath(n.NetNS), "127.0.0.1:10256", "GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
}

// HTTPStatusIn sends one raw request on a new connection made inside the
// network namespace at nsPath (a dial in this thread; the exchange may
// then run anywhere) and returns the answer's status.
func HTTPStatusIn(nsPath, addr, request string) (int, error) {
	var c net.Conn
	err := InNS(nsPath, func() (err error) {
		c, err = net.DialTimeout("tcp4", addr, 2*time.Second)
		return err
	})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, request); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

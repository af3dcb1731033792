package lab

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weirnet/weir/internal/lab/manifests"
)

// upKubernetes turns the plugged-in nodes into a Kubernetes cluster: the
// control plane in a namespace of its own, then every node's containerd,
// kubelet, kube-proxy and Weir agent, and waits until every Node is Ready,
// which it only becomes once Weir has written its CNI config.
func (st *State) upKubernetes(ctx context.Context, out io.Writer) error {
	start := time.Now()
	bins, err := ClusterBinaries(ctx, out)
	if err != nil {
		return err
	}
	st.Kube = &KubeState{
		Version: KubernetesVersion, Bins: bins,
		PKIDir: filepath.Join(st.RunDir, "pki"), DataDir: DataDir(st.Config.Name),
	}
	if err := st.save(); err != nil {
		return err
	}
	if err := sharedMount(st.RunDir); err != nil {
		return err
	}
	images, err := st.buildImages()
	if err != nil {
		return err
	}
	if err := plugHost(st.Underlay, st.cpNS(), "cp", controlPlaneIP); err != nil {
		return err
	}
	p, err := st.issueCerts()
	if err != nil {
		return err
	}
	if err := st.startControlPlane(ctx, p, out); err != nil {
		return err
	}
	// Weir's chart, as an operator installs it: the CRDs and RBAC now,
	// before any node, and the agent DaemonSet, whose pods start as the
	// nodes register (unless the agents run as host processes). A lab
	// without a CNI leaves that to the operator.
	withCNI := st.Config.CNI != CNINone
	if withCNI {
		if err := st.installWeirBeforeNodes(ctx); err != nil {
			return err
		}
	}
	for i := range st.Nodes {
		if err := st.startKubeNode(ctx, p, &st.Nodes[i], images); err != nil {
			return err
		}
	}
	if st.Config.BridgeRuntime {
		rc := "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {name: bridge}\nhandler: bridge\n"
		if _, err := st.Kubectl(ctx, strings.NewReader(rc), "apply", "-f", "-"); err != nil {
			return err
		}
	}
	// A node is Ready once a CNI wrote its config; without one, the lab
	// waits only until each has registered and got its pod CIDR.
	if err := st.waitNodes(ctx, 3*time.Minute, withCNI, out); err != nil {
		return err
	}
	if err := st.routePodsFromControlPlane(); err != nil {
		return err
	}
	dns := strings.NewReplacer("IMAGE", CoreDNSImage, "CLUSTER_DNS_IP", ClusterDNSIP.String())
	if err := st.applyManifests(ctx, manifests.FS, dns, "coredns.yaml"); err != nil {
		return err
	}
	if !withCNI {
		return st.awaitOperatorCNI(start, out)
	}
	if err := st.WaitDeployment(ctx, "kube-system", "coredns", 2*time.Minute); err != nil {
		return fmt.Errorf("cluster DNS: %w", err)
	}
	fmt.Fprintf(out, "  cluster DNS ready at %v\n", ClusterDNSIP)
	fmt.Fprintf(out, "  cluster ready in %s; kubectl: `weir lab kubectl get nodes`, or KUBECONFIG=%s\n",
		time.Since(start).Round(100*time.Millisecond), st.Kube.Kubeconfig)
	return st.save()
}

// installWeirBeforeNodes installs Weir's chart and waits until the API
// server serves its CRDs: the agents' watches fail their sync on a kind
// not yet served.
func (st *State) installWeirBeforeNodes(ctx context.Context) error {
	if err := st.InstallWeir(ctx); err != nil {
		return err
	}
	// Every CRD the cluster has (the lab's are the chart's): a release
	// installed for an upgrade has fewer kinds than this tree's chart.
	if _, err := st.Kubectl(ctx, nil, "wait", "--for=condition=Established", "--timeout=60s", "crd", "--all"); err != nil {
		return fmt.Errorf("weir CRDs: %w", err)
	}
	return nil
}

// awaitOperatorCNI ends the bring-up of a lab without a CNI: it writes the
// chart values the lab's nodes need (LabValuesFile) and tells the operator
// how to install Weir. CoreDNS stays Pending until then.
func (st *State) awaitOperatorCNI(start time.Time, out io.Writer) error {
	file, err := st.writeLabValues()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  cluster up without a CNI in %s: nodes NotReady, CoreDNS Pending until one is installed\n",
		time.Since(start).Round(100*time.Millisecond))
	fmt.Fprintf(out, "  install Weir as README's \"Install on your cluster\" says, with the values these nodes need:\n"+
		"    export KUBECONFIG=%s\n    %s install weir deploy/helm/weir --namespace kube-system --values %s\n",
		st.Kube.Kubeconfig, st.KubeBin("helm"), file)
	return st.save()
}

// sharedMount bind-mounts dir onto itself and makes it shared, as every
// directory of a systemd host is: mounts made below it later (pod network
// namespaces, volumes) then reach containers that mount it with
// HostToContainer propagation. Down's unmountUnder removes it.
func sharedMount(dir string) error {
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	return nil
}

// buildImages builds (or finds in the cache) every image the nodes import.
func (st *State) buildImages() ([]string, error) {
	var out []string
	specs, err := labImages(st.Config.BinDir, st.Kube.Bins)
	if err != nil {
		return nil, err
	}
	for _, spec := range specs {
		path, err := spec.build()
		if err != nil {
			return nil, err
		}
		out = append(out, path)
	}
	agent, err := agentImage(st.Config.BinDir)
	if err != nil {
		return nil, err
	}
	out = append(out, agent)
	if st.Config.Release != "" {
		r, err := buildRelease(context.Background(), st.Config.Release, io.Discard)
		if err != nil {
			return nil, err
		}
		out = append(out, r.Image)
	}
	return out, nil
}

// Kubectl runs the lab's kubectl with the admin kubeconfig.
func (st *State) Kubectl(ctx context.Context, stdin io.Reader, args ...string) ([]byte, error) {
	if st.Kube == nil {
		return nil, fmt.Errorf("lab %s runs no Kubernetes", st.Config.Name)
	}
	cmd := st.KubectlCommand(ctx, args...)
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// KubectlCommand is the lab's kubectl with the admin kubeconfig and args.
func (st *State) KubectlCommand(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, st.KubeBin("kubectl"), append([]string{"--kubeconfig", st.Kube.Kubeconfig}, args...)...)
}

// applyManifests applies embedded manifests with kubectl, as an operator
// would, after replacing their placeholders with r (nil: none).
func (st *State) applyManifests(ctx context.Context, fsys fs.FS, r *strings.Replacer, names ...string) error {
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return err
		}
		text := string(b)
		if r != nil {
			text = r.Replace(text)
		}
		if _, err := st.Kubectl(ctx, strings.NewReader(text), "apply", "-f", "-"); err != nil {
			return err
		}
	}
	return nil
}

// waitNodes waits until every lab node has registered with a pod CIDR and,
// if ready, is Ready, and records the pod CIDR the controller manager gave
// it.
func (st *State) waitNodes(ctx context.Context, timeout time.Duration, ready bool, out io.Writer) error {
	c, err := st.Client()
	if err != nil {
		return err
	}
	start := time.Now()
	done := map[string]bool{}
	state := "registered"
	if ready {
		state = "Ready"
	}
	for {
		nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, n := range nodes.Items {
				if done[n.Name] || n.Spec.PodCIDR == "" || (ready && !nodeReady(&n)) {
					continue
				}
				done[n.Name] = true
				if node, err := st.NodeByName(n.Name); err == nil {
					node.PodCIDR, _ = netip.ParsePrefix(n.Spec.PodCIDR)
				}
				fmt.Fprintf(out, "  node %s %s after %s, pod CIDR %s\n", n.Name, state, time.Since(start).Round(100*time.Millisecond), n.Spec.PodCIDR)
			}
		}
		if len(done) == len(st.Nodes) {
			return nil
		}
		for _, p := range st.Kube.Procs {
			if !processAlive(p.PID) {
				return fmt.Errorf("%s exited; its log %s says:\n%s", p.Name, p.Log, tail(p.Log, 20))
			}
		}
		if time.Since(start) > timeout {
			return fmt.Errorf("nodes not %s after %s (%s: %v); see the logs in %s", state, timeout, state, done, filepath.Join(st.RunDir, "logs"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// WaitDeployment waits until every replica of a Deployment is available.
func (st *State) WaitDeployment(ctx context.Context, ns, name string, timeout time.Duration) error {
	c, err := st.Client()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		d, err := c.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && d.Spec.Replicas != nil && d.Status.ObservedGeneration >= d.Generation &&
			d.Status.AvailableReplicas == *d.Spec.Replicas && d.Status.UpdatedReplicas == *d.Spec.Replicas && d.Status.Replicas == *d.Spec.Replicas {
			return nil
		}
		if time.Now().After(deadline) {
			status := "not found"
			if d != nil {
				status = fmt.Sprintf("%d/%d available", d.Status.AvailableReplicas, d.Status.Replicas)
			}
			return fmt.Errorf("deployment %s/%s not available after %s (%s, %v)", ns, name, timeout, status, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// PodNetNS finds the network namespace file of the pod that has ip, among
// the namespaces the nodes' containerds made. Tests use it to open
// connections from inside a pod without the API server.
func (st *State) PodNetNS(ip netip.Addr) (string, error) {
	for i := range st.Nodes {
		dir := filepath.Join(st.RunDir, st.Nodes[i].Name, "containerd", "state", "io.containerd.grpc.v1.cri", "netns")
		paths, _ := filepath.Glob(filepath.Join(dir, "cni-*"))
		for _, p := range paths {
			found := false
			InNS(p, func() error {
				addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
				for _, a := range addrs {
					if a.IP.Equal(net.IP(ip.AsSlice())) {
						found = true
					}
				}
				return err
			})
			if found {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("no pod network namespace of lab %s has %v", st.Config.Name, ip)
}

// KillAgent kills a node's weir-agent with SIGKILL, as a crash would: the
// lab's process in host mode, the DaemonSet pod's process otherwise (which
// kubelet then restarts).
func (st *State) KillAgent(node string) error {
	n, err := st.NodeByName(node)
	if err != nil {
		return err
	}
	if st.Config.AgentMode == AgentHost {
		return st.KillServer(node + "/weir-agent")
	}
	pid, err := agentPID(n.Socket)
	if err != nil {
		return err
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		return fmt.Errorf("kill agent of %s (pid %d): %w", node, pid, err)
	}
	for processAlive(pid) {
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// AgentPID is the PID of the weir-agent serving a node, in either agent
// mode: benchmarks read its memory and CPU time from /proc.
func (st *State) AgentPID(node string) (int, error) {
	n, err := st.NodeByName(node)
	if err != nil {
		return 0, err
	}
	return agentPID(n.Socket)
}

// agentPID finds the weir-agent process serving socket: a host process
// names it in its flags ("--socket PATH"); the DaemonSet's agent reads it
// from the chart's ConfigMap, and its container's environment carries it
// (WEIR_AGENT_SOCKET, which the health command reads too).
func agentPID(socket string) (int, error) {
	agents := procsMatching(func(args []string) bool { return filepath.Base(args[0]) == "weir-agent" })
	for _, pid := range agents {
		if agentServes(pid, socket) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no weir-agent process serves %s", socket)
}

// agentServes says whether the weir-agent process pid serves socket, by
// its flags or its environment.
func agentServes(pid int, socket string) bool {
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00")
	if i := slices.Index(args, "--socket"); slices.Contains(args[1:], "--socket="+socket) || (i > 0 && i+1 < len(args) && args[i+1] == socket) {
		return true
	}
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	return err == nil && slices.Contains(strings.Split(string(env), "\x00"), "WEIR_AGENT_SOCKET="+socket)
}

// routePodsFromControlPlane routes each node's pod CIDR from the control
// plane's namespace to that node, as a control plane on a cluster node
// reaches pods: the API server dials them for its pod and Service proxy
// (kubectl proxy, the upstream suite's Proxy specs), webhooks and
// aggregated APIs.
func (st *State) routePodsFromControlPlane() error {
	return inNS(st.cpNS(), func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, n := range st.Nodes {
			if !n.PodCIDR.IsValid() {
				return fmt.Errorf("node %s has no pod CIDR to route from the control plane", n.Name)
			}
			dst := &net.IPNet{IP: n.PodCIDR.Addr().AsSlice(), Mask: net.CIDRMask(n.PodCIDR.Bits(), 32)}
			if err := netlink.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Gw: n.IP.AsSlice()}); err != nil {
				return fmt.Errorf("control plane: route %v via %s: %w", n.PodCIDR, n.Name, err)
			}
		}
		return nil
	})
}

package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Addressing of a Kubernetes lab, beside the underlay's (topology.go).
var (
	controlPlaneIP = netip.MustParseAddr("10.99.0.10")
	serviceCIDR    = netip.MustParsePrefix("10.96.0.0/16")
	// apiServiceIP is the "kubernetes" Service: the first service address.
	apiServiceIP = netip.MustParseAddr("10.96.0.1")
	// ClusterDNSIP is the kube-dns Service address kubelets give pods.
	ClusterDNSIP = netip.MustParseAddr("10.96.0.10")
)

const apiPort = 6443

// KubeState is the Kubernetes part of a running lab.
type KubeState struct {
	Version string            `json:"version"`
	Bins    map[string]string `json:"bins"` // build name -> directory
	PKIDir  string            `json:"pkiDir"`
	DataDir string            `json:"dataDir"`
	// Kubeconfig is the admin kubeconfig for the root namespace; it
	// reaches the API server through the lab's proxy on loopback.
	Kubeconfig string `json:"kubeconfig"`
	ProxyAddr  string `json:"proxyAddr"`
	// Procs are every server the lab runs, in start order.
	Procs []Proc `json:"procs"`
}

func (st *State) cpNS() string  { return st.Config.Name + "-cp" }
func (st *State) cpDir() string { return filepath.Join(st.RunDir, "cp") }

// KubeBin is the path of one of the lab's cluster binaries (etcd,
// containerd and its tools, helm, or a Kubernetes one), from the build
// cache.
func (st *State) KubeBin(b string) string {
	dir := "kubernetes"
	switch b {
	case "etcd":
		dir = "etcd"
	case "containerd", "ctr", "containerd-shim-runc-v2":
		dir = "containerd"
	case "helm":
		dir = "helm"
	}
	return filepath.Join(st.Kube.Bins[dir], b)
}

// DataDir is where a Kubernetes lab keeps image stores and kubelet roots.
func DataDir(name string) string { return filepath.Join("/var/lib", name) }

// issueCerts makes the lab's CA and every identity the cluster uses.
func (st *State) issueCerts() (*pki, error) {
	p, err := newPKI(st.Kube.PKIDir)
	if err != nil {
		return nil, err
	}
	ips := []net.IP{net.IP(controlPlaneIP.AsSlice()), net.IP(apiServiceIP.AsSlice()), net.IPv4(127, 0, 0, 1)}
	specs := []certSpec{
		{name: "apiserver", cn: "kube-apiserver", ips: ips, server: true,
			dns: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}},
		{name: "apiserver-kubelet-client", cn: "kube-apiserver-kubelet-client", orgs: []string{"system:masters"}},
		{name: "admin", cn: "weir-lab-admin", orgs: []string{"system:masters"}},
		{name: "controller-manager", cn: "system:kube-controller-manager"},
		{name: "scheduler", cn: "system:kube-scheduler"},
		{name: "kube-proxy", cn: "system:kube-proxy"},
		{name: "weir-agent", cn: "weir-agent", orgs: []string{"weir:agents"}},
	}
	for _, n := range st.Nodes {
		specs = append(specs, certSpec{name: "node-" + n.Name, cn: "system:node:" + n.Name, orgs: []string{"system:nodes"}})
	}
	for _, s := range specs {
		if err := p.issue(s); err != nil {
			return nil, err
		}
	}
	return p, p.serviceAccountKeys()
}

// apiServerURL is how everything inside the lab reaches the API server.
func apiServerURL() string { return fmt.Sprintf("https://%s:%d", controlPlaneIP, apiPort) }

// kubeconfigPath is the kubeconfig of one identity, for use inside the lab.
func (st *State) kubeconfigPath(identity string) string {
	return filepath.Join(st.RunDir, "kubeconfig-"+identity)
}

// startControlPlane runs etcd, the API server, the controller manager and
// the scheduler in the control-plane namespace, and the loopback proxy
// that lets the root namespace reach the API server.
func (st *State) startControlPlane(ctx context.Context, p *pki, out io.Writer) error {
	for _, id := range []string{"admin", "controller-manager", "scheduler", "kube-proxy", "weir-agent"} {
		if err := p.kubeconfig(st.kubeconfigPath(id), apiServerURL(), id); err != nil {
			return err
		}
	}
	dir := st.cpDir()
	if err := st.run("etcd", st.cpNS(), st.KubeBin("etcd"),
		"--name", "weir-lab", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "weir-lab=http://127.0.0.1:2380",
		// The lab's cluster lives as long as the lab; no fsync keeps a
		// 2-core machine's disk out of every API write.
		"--unsafe-no-fsync", "--log-level", "warn",
	); err != nil {
		return err
	}
	if err := st.run("kube-apiserver", st.cpNS(), st.KubeBin("kube-apiserver"),
		"--etcd-servers", "http://127.0.0.1:2379",
		"--advertise-address", controlPlaneIP.String(), "--bind-address", "0.0.0.0", "--secure-port", strconv.Itoa(apiPort),
		"--service-cluster-ip-range", serviceCIDR.String(),
		"--tls-cert-file", p.path("apiserver.crt"), "--tls-private-key-file", p.path("apiserver.key"),
		"--client-ca-file", p.path("ca.crt"),
		"--kubelet-client-certificate", p.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key", p.path("apiserver-kubelet-client.key"),
		// Node names would otherwise be resolved through the machine's
		// DNS server, which is outside the lab.
		"--kubelet-preferred-address-types", "InternalIP",
		"--service-account-key-file", p.path("sa.pub"), "--service-account-signing-key-file", p.path("sa.key"),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
		"--allow-privileged=true", "--profiling=false", "--v=1",
	); err != nil {
		return err
	}
	if err := st.startAPIProxy(); err != nil {
		return err
	}
	if err := st.writeAdminKubeconfig(p); err != nil {
		return err
	}
	start := time.Now()
	if err := st.waitAPIServer(ctx, 90*time.Second); err != nil {
		return err
	}
	fmt.Fprintf(out, "  control plane: API server ready in %s\n", time.Since(start).Round(100*time.Millisecond))
	if err := st.run("kube-controller-manager", st.cpNS(), st.KubeBin("kube-controller-manager"),
		"--kubeconfig", st.kubeconfigPath("controller-manager"),
		"--authentication-kubeconfig", st.kubeconfigPath("controller-manager"),
		"--authorization-kubeconfig", st.kubeconfigPath("controller-manager"),
		"--allocate-node-cidrs", "--cluster-cidr", st.Config.ClusterCIDR.String(), "--node-cidr-mask-size", "24",
		"--service-cluster-ip-range", serviceCIDR.String(),
		"--cluster-signing-cert-file", p.path("ca.crt"), "--cluster-signing-key-file", p.path("ca.key"),
		"--root-ca-file", p.path("ca.crt"), "--service-account-private-key-file", p.path("sa.key"),
		"--use-service-account-credentials", "--leader-elect=false", "--bind-address", "127.0.0.1",
		"--configure-cloud-routes=false", "--v=1",
	); err != nil {
		return err
	}
	return st.run("kube-scheduler", st.cpNS(), st.KubeBin("kube-scheduler"),
		"--kubeconfig", st.kubeconfigPath("scheduler"),
		"--authentication-kubeconfig", st.kubeconfigPath("scheduler"),
		"--authorization-kubeconfig", st.kubeconfigPath("scheduler"),
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--v=1",
	)
}

// run starts one lab server and records it before anything can fail, so
// Down always finds it.
func (st *State) run(name, netns string, argv ...string) error {
	logDir := filepath.Join(st.RunDir, "logs")
	p, err := startProc(name, netns, filepath.Join(logDir, sanitize(name)+".log"), argv, nil)
	if err != nil {
		return err
	}
	st.Kube.Procs = append(st.Kube.Procs, p)
	if err := st.save(); err != nil {
		return err
	}
	time.Sleep(50 * time.Millisecond)
	if !processAlive(p.PID) {
		return fmt.Errorf("%s exited at once; its log %s says:\n%s", name, p.Log, tail(p.Log, 20))
	}
	return nil
}

func sanitize(s string) string { return strings.ReplaceAll(s, "/", "-") }

// StopServer stops one of the lab's servers by name ("kube-apiserver",
// "n1/weir-agent", ...); StartServer starts it again with the same command.
func (st *State) StopServer(name string) error {
	p, err := st.proc(name)
	if err != nil {
		return err
	}
	return p.stop(10 * time.Second)
}

// KillServer kills one of the lab's servers with SIGKILL, as a crash would.
func (st *State) KillServer(name string) error {
	p, err := st.proc(name)
	if err != nil {
		return err
	}
	if !p.Alive() {
		return fmt.Errorf("%s is not running", name)
	}
	if err := syscall.Kill(p.PID, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill %s: %w", name, err)
	}
	for processAlive(p.PID) {
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// StartServer starts a stopped server again and records its new PID.
func (st *State) StartServer(name string) error {
	p, err := st.proc(name)
	if err != nil {
		return err
	}
	if p.Alive() {
		return fmt.Errorf("%s is running (pid %d)", name, p.PID)
	}
	np, err := startProc(p.Name, p.NetNS, p.Log, p.Argv, nil)
	if err != nil {
		return err
	}
	*p = np
	return st.save()
}

// Servers lists the lab's servers in start order.
func (st *State) Servers() []Proc {
	if st.Kube == nil {
		return nil
	}
	return append([]Proc(nil), st.Kube.Procs...)
}

// proc finds a recorded server by name.
func (st *State) proc(name string) (*Proc, error) {
	for i := range st.Kube.Procs {
		if st.Kube.Procs[i].Name == name {
			return &st.Kube.Procs[i], nil
		}
	}
	return nil, fmt.Errorf("lab %s runs no %s", st.Config.Name, name)
}

// startAPIProxy runs `weir lab api-proxy` in the root namespace: a
// loopback listener whose connections are dialled from inside the control
// plane's namespace. The lab's namespaces have no route to or from the
// root namespace, and the root namespace needs none.
func (st *State) startAPIProxy() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	st.Kube.ProxyAddr = ln.Addr().String()
	ln.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if filepath.Base(self) != "weir" {
		self = filepath.Join(st.Config.BinDir, "weir")
	}
	return st.run("api-proxy", "", self, "lab", "api-proxy", "--listen", st.Kube.ProxyAddr,
		"--netns", nsPath(st.cpNS()), "--target", net.JoinHostPort(controlPlaneIP.String(), strconv.Itoa(apiPort)))
}

func (st *State) writeAdminKubeconfig(p *pki) error {
	st.Kube.Kubeconfig = filepath.Join(st.RunDir, "kubeconfig")
	return p.kubeconfig(st.Kube.Kubeconfig, "https://"+st.Kube.ProxyAddr, "admin")
}

// Client is an admin client of the lab's API server.
func (st *State) Client() (kubernetes.Interface, error) {
	if st.Kube == nil {
		return nil, fmt.Errorf("lab %s runs no Kubernetes (bring it up without --bare)", st.Config.Name)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", st.Kube.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 100, 200
	return kubernetes.NewForConfig(cfg)
}

// waitAPIServer polls /readyz until it answers ok.
func (st *State) waitAPIServer(ctx context.Context, timeout time.Duration) error {
	c, err := st.Client()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		body, err := c.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
		cancel()
		if err == nil && string(body) == "ok" {
			return nil
		}
		for _, name := range []string{"etcd", "kube-apiserver", "api-proxy"} {
			if p, perr := st.proc(name); perr == nil && !processAlive(p.PID) {
				return fmt.Errorf("%s exited; its log %s says:\n%s", name, p.Log, tail(p.Log, 20))
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("API server not ready after %s (last: %v %s); log %s", timeout, err, body, filepath.Join(st.RunDir, "logs", "kube-apiserver.log"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

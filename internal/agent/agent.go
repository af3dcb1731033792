package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/ipam"
	"github.com/weirnet/weir/internal/k8s"
)

// Config is everything an agent needs to run one node.
type Config struct {
	NodeName    string
	Mode        datapath.Mode
	UnderlayDev string
	NodeIP      netip.Addr
	PodCIDR     netip.Prefix
	ClusterCIDR netip.Prefix
	StateDir    string // leases and other durable state
	PinDir      string // bpffs directory of this node's pins
	Socket      string // the local API's unix socket
	// HealthAddr is a TCP address (host:port) answering only the health
	// check, so the kubelet can probe the agent without exec'ing a
	// process into its container every period. Empty: none.
	HealthAddr string
	// MetricsAddr is a TCP address (host:port, the host may be empty for
	// every address) serving the Prometheus metrics alone, for scrapes
	// from off the node. Empty: only the socket serves them.
	MetricsAddr string
	Peers       []api.Peer

	// Kubernetes makes the agent a Kubernetes node agent: the pod CIDR,
	// node address and peers come from the API server (Kubeconfig, or the
	// pod's service account when empty) instead of flags.
	Kubernetes bool
	Kubeconfig string
	// CNIConfDir is where the agent writes its CNI configuration once it
	// can serve ADDs, so the runtime (and so the Node) turns ready only
	// when Weir is. Empty: the agent writes none.
	CNIConfDir string
	// CNIShared leaves other CNIs' configurations in CNIConfDir in place;
	// otherwise the agent sets them aside (cni.SetAsideOthers) when it
	// writes its own, so the runtime attaches new pods with Weir.
	CNIShared bool
	// FlowDir is where the node's flows are kept, aggregated, across
	// restarts; FlowMaxBytes bounds it, the oldest dropped first. Empty
	// and zero: StateDir/flows and 64 MiB.
	FlowDir      string
	FlowMaxBytes int64
	// NoFlowEvents loads the datapath without verdict events: no flows
	// are recorded. For measuring what flows cost; on by default.
	NoFlowEvents bool
	// NoIdentityOption keeps native routing from carrying the sending
	// pod's identity in its flows' first packets (an IPv4 option), for
	// underlays that drop IPv4 options.
	NoIdentityOption bool
	// KubeProxyReplacement says no kube-proxy runs beside the agent: it
	// answers every ClusterIP itself, for the node's own processes and
	// hostNetwork pods too, with session affinity, and refuses
	// connections to Services without backends at once.
	KubeProxyReplacement bool
	// NoSocketLB leaves every Service to kube-proxy (never with
	// KubeProxyReplacement): the service maps stay empty, so the socket
	// programs translate nothing and kube-proxy's rules see the ClusterIP.
	NoSocketLB bool
	// HashSeed is the cluster's secret for the hash NodePort flows pick
	// their backend with (the same on every node): in Kubernetes, from
	// the kube-system namespace's UID (clusterHashSeed).
	HashSeed uint64
	// HealthCheckNodePortAddr is the host health check node ports are
	// opened on (with KubeProxyReplacement); empty: every address.
	HealthCheckNodePortAddr string
	// ProxyHealthzAddr and ProxyStatusAddr are where kube-proxy's own
	// /healthz (and /livez) and /proxyMode are answered with
	// KubeProxyReplacement; empty: not served.
	ProxyHealthzAddr, ProxyStatusAddr string
	// CgroupRoot, SysctlDir and NoMountBPFFS: see datapath.NodeConfig.
	CgroupRoot, SysctlDir string
	NoMountBPFFS          bool
	// TunnelPort and MTU: see datapath.NodeConfig.
	TunnelPort uint16
	MTU        int
}

// nodeConfig is the datapath's share of the config.
func (c Config) nodeConfig() datapath.NodeConfig {
	return datapath.NodeConfig{
		Name: c.NodeName, Mode: c.Mode, UnderlayDev: c.UnderlayDev,
		NodeIP: c.NodeIP, PodCIDR: c.PodCIDR, ClusterCIDR: c.ClusterCIDR, PinDir: c.PinDir,
		NoFlowEvents: c.NoFlowEvents, NoIdentityOption: c.NoIdentityOption,
		KubeProxyReplacement: c.KubeProxyReplacement, HashSeed: c.HashSeed,
		TunnelPort: c.TunnelPort, MTU: c.MTU,
		CgroupRoot: c.CgroupRoot, SysctlDir: c.SysctlDir, NoMountBPFFS: c.NoMountBPFFS,
	}
}

// Agent owns one node's leases and datapath.
type Agent struct {
	cfg  Config
	log  *slog.Logger
	dp   Datapath
	ipam *ipam.Allocator
	mu   sync.Mutex // serialises every change to leases and datapath
	// recordMu serialises recordEventBatch (the ticker, a follower's
	// subscription and Close all record the batch).
	recordMu sync.Mutex
	peers    []api.Peer
	// policyEvents reports NetworkPolicies this node cannot load
	// (Kubernetes mode; guarded by mu).
	policyEvents policyEvents
	// serviceEvents reports Services this node's full service maps left
	// out (in Kubernetes).
	serviceEvents serviceEvents
	// pods is this node's pods as the API server describes them, by
	// namespace/name (Kubernetes mode only).
	pods     map[string]k8s.Pod
	kube     *api.KubeStatus
	policy   policyState
	services serviceState
	// identities allocates and collects security identities (Kubernetes
	// mode only).
	identities *identityWork
	// onEndpoint, if set, is called after an endpoint is added.
	onEndpoint func()
	// snapshot, if set (Kubernetes mode), reads the cluster state a new
	// endpoint's policy is compiled from before its ADD returns.
	snapshot func() (k8s.Snapshot, bool)
	// flows keeps the node's verdicts; flowNames explains them.
	flows     *flowLog
	flowNames atomic.Pointer[flowNames]
	// serviceNames names the Services flow records went through.
	serviceNames serviceNames
	metrics      *metrics
	// healthChecks answers health check node ports (with
	// KubeProxyReplacement; nil otherwise).
	healthChecks *healthCheckServers
	// proxyHealth answers kube-proxy's health and status endpoints (with
	// KubeProxyReplacement); nil otherwise.
	proxyHealth *proxyHealth
}

// New builds an agent over an already set-up datapath, adopting the
// endpoints a previous run left and sweeping anything orphaned.
func New(cfg Config, dp Datapath, log *slog.Logger) (_ *Agent, retErr error) {
	alloc, err := ipam.Open(filepath.Join(cfg.StateDir, "ipam.json"), cfg.PodCIDR)
	if err != nil {
		return nil, err
	}
	flows, err := openFlowLog(cfg, log)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			flows.close()
		}
	}()
	a := &Agent{cfg: cfg, log: log, dp: dp, ipam: alloc, flows: flows}
	if cfg.KubeProxyReplacement {
		a.healthChecks = newHealthCheckServers(cfg.HealthCheckNodePortAddr, log)
		if a.proxyHealth, err = openProxyHealth(cfg.ProxyHealthzAddr, cfg.ProxyStatusAddr, log); err != nil {
			return nil, err
		}
		defer func() {
			if retErr != nil {
				a.proxyHealth.close()
			}
		}()
	}
	a.metrics = newMetrics(dp, flows, log)
	a.metrics.verdicts.names = a.flowNames.Load
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.adoptLocked(); err != nil {
		return nil, fmt.Errorf("adopt existing endpoints: %w", err)
	}
	if err := a.setPeersLocked(cfg.Peers); err != nil {
		return nil, err
	}
	return a, nil
}

// Close writes the flows held in memory to the flow store and closes it,
// logging a failure too, since Run's deferred call cannot return it. The
// datapath is the caller's: it keeps forwarding.
func (a *Agent) Close() error {
	a.stopPolicyRetries()
	if a.healthChecks != nil {
		a.healthChecks.close()
	}
	if a.proxyHealth != nil {
		a.proxyHealth.close()
	}
	err := a.flows.close()
	if err != nil {
		a.log.Warn("close flow store: flows lost", "err", err)
	}
	return err
}

// Run sets up the node's datapath and serves the local API until ctx ends.
// The datapath keeps forwarding after Run returns: it is pinned.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if cfg.Kubernetes {
		return runKubernetes(ctx, cfg, log)
	}
	a, node, err := start(cfg, log)
	if err != nil {
		return err
	}
	defer node.Close()
	defer a.Close()
	if err := a.readFlows(ctx, node); err != nil {
		return err
	}
	return a.Serve(ctx)
}

// start programs the node's datapath and builds the agent over it; the
// caller closes the node (its pinned programs keep running).
func start(cfg Config, log *slog.Logger) (*Agent, *datapath.Node, error) {
	node, err := datapath.SetupNode(cfg.nodeConfig())
	if err != nil {
		return nil, nil, fmt.Errorf("set up datapath: %w", err)
	}
	for _, note := range node.MapMigrationNotes() {
		log.Info("pinned map of an earlier version", "change", note)
	}
	a, err := New(cfg, node, log)
	if err != nil {
		node.Close()
		return nil, nil, err
	}
	// Every link runs this version's programs now (the devices' at setup,
	// the pods' at adoption): what the old ones wrote meanwhile into maps
	// carried over is copied once more.
	if n, err := node.FinishMapMigration(); err != nil {
		log.Warn("carrying over entries written during the upgrade", "err", err)
	} else if n > 0 {
		log.Info("carried over entries written during the upgrade", "entries", n)
	}
	return a, node, nil
}

// Serve answers the local API on cfg.Socket until ctx ends.
func (a *Agent) Serve(ctx context.Context) error {
	ln, err := a.Listen()
	if err != nil {
		return err
	}
	return a.ServeOn(ctx, ln)
}

// Listen opens the local API's socket, replacing a stale one. The API
// adds and removes pods' networking and changes peers, so only root may
// use it: the socket is made under a temporary name, restricted to its
// owner (root, the agent), and only then renamed into place, so there is
// no moment at which it exists with the umask's looser mode.
func (a *Agent) Listen() (ln net.Listener, retErr error) {
	dir := filepath.Dir(a.cfg.Socket)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	// A name of this start's own: an agent still stopping beside it (a
	// rollout; PID 1 in both containers) never shares it.
	tmp := filepath.Join(dir, fmt.Sprintf(".%s.%016x", filepath.Base(a.cfg.Socket), rand.Uint64()))
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", a.cfg.Socket, err)
	}
	// The listener must not unlink the temporary name on close once it
	// is renamed: the final name is removed by the next Listen.
	ul.SetUnlinkOnClose(false)
	defer func() {
		if retErr != nil {
			ul.Close()
			os.Remove(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o600); err != nil {
		return nil, fmt.Errorf("restrict %s: %w", a.cfg.Socket, err)
	}
	if err := os.Rename(tmp, a.cfg.Socket); err != nil {
		return nil, fmt.Errorf("put the socket at %s: %w", a.cfg.Socket, err)
	}
	return ul, nil
}

// ServeOn answers the local API on ln, and the health check on
// cfg.HealthAddr, until ctx ends.
func (a *Agent) ServeOn(ctx context.Context, ln net.Listener) error {
	servers := []*http.Server{{Handler: a.Handler(), ReadHeaderTimeout: 10 * time.Second,
		// Requests inherit ctx, so followed streams end with the agent.
		BaseContext: func(net.Listener) context.Context { return ctx }}}
	listeners := []net.Listener{ln}
	if a.cfg.HealthAddr != "" {
		hl, err := net.Listen("tcp", a.cfg.HealthAddr)
		if err != nil {
			ln.Close()
			return fmt.Errorf("health address %s (--health-addr): %w", a.cfg.HealthAddr, err)
		}
		servers = append(servers, &http.Server{Handler: a.HealthHandler(), ReadHeaderTimeout: 5 * time.Second})
		listeners = append(listeners, hl)
	}
	if a.cfg.MetricsAddr != "" {
		ml, err := net.Listen("tcp", a.cfg.MetricsAddr)
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
			return fmt.Errorf("metrics address %s (--metrics-addr): %w", a.cfg.MetricsAddr, err)
		}
		servers = append(servers, &http.Server{Handler: a.MetricsHandler(), ReadHeaderTimeout: 5 * time.Second})
		listeners = append(listeners, ml)
	}
	go a.metrics.maps.run(ctx)
	go a.gcRevokedFlows(ctx)
	go a.resetClosedHTTP(ctx)
	done := make(chan error, len(servers))
	for i, srv := range servers {
		go func() { done <- srv.Serve(listeners[i]) }()
	}
	a.log.Info("agent ready", "node", a.cfg.NodeName, "socket", a.cfg.Socket, "health", a.cfg.HealthAddr, "metrics", a.cfg.MetricsAddr, "mode", a.cfg.Mode, "podCIDR", a.cfg.PodCIDR, "mtu", a.dp.PodMTU())
	shutdown := func() error {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var errs []error
		for _, srv := range servers {
			errs = append(errs, srv.Shutdown(shutdownCtx))
		}
		os.Remove(a.cfg.Socket)
		return errors.Join(errs...)
	}
	select {
	case <-ctx.Done():
		return shutdown()
	case err := <-done:
		shutdown()
		return fmt.Errorf("serve API: %w", err)
	}
}

// SetPeers replaces the set of other nodes.
func (a *Agent) SetPeers(peers []api.Peer) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.setPeersLocked(peers)
}

func (a *Agent) setPeersLocked(peers []api.Peer) error {
	// A node list usually includes this node; it is no peer of itself.
	others := make([]api.Peer, 0, len(peers))
	dp := make([]datapath.Peer, 0, len(peers))
	for _, p := range peers {
		if p.NodeIP == a.cfg.NodeIP || p.PodCIDR == a.cfg.PodCIDR {
			continue
		}
		others = append(others, p)
		dp = append(dp, datapath.Peer{Name: p.Name, NodeIP: p.NodeIP, PodCIDR: p.PodCIDR})
	}
	if err := a.dp.SetPeers(dp); err != nil {
		return api.Errorf(api.CodeDatapath, "program peers", err)
	}
	a.peers = others
	return nil
}

// Status reports the node's state.
func (a *Agent) Status() (*api.Status, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := &api.Status{
		Node: a.cfg.NodeName, Ready: true, Mode: string(a.cfg.Mode), NodeIP: a.cfg.NodeIP,
		PodCIDR: a.ipam.CIDR(), MTU: a.dp.PodMTU(), Capacity: a.ipam.Capacity(),
		Endpoints: []api.Endpoint{}, Peers: append([]api.Peer{}, a.peers...),
		Kubernetes: a.kube,
	}
	for _, l := range a.ipam.List() {
		s.Endpoints = append(s.Endpoints, api.Endpoint{
			Attachment: api.Attachment{ContainerID: l.ContainerID, IfName: l.IfName},
			Address:    l.Addr, HostIfName: datapath.HostIfName(l.ContainerID, l.IfName),
			PodNamespace: l.PodNamespace, PodName: l.PodName, NetNS: l.NetNS,
			Labels: a.pods[l.PodNamespace+"/"+l.PodName].Labels,
		})
	}
	entries, err := a.dp.Endpoints()
	if err != nil {
		return nil, err
	}
	s.MapEntries = len(entries)
	if s.Counters, err = a.dp.Metrics(); err != nil {
		return nil, err
	}
	if s.Counters == nil {
		s.Counters = map[string]uint64{}
	}
	a.flows.addCounters(s.Counters)
	s.Policy = a.policyStatusLocked()
	s.Services = a.servicesSummaryLocked()
	return s, nil
}

// policyStatusLocked summarises the loaded policy for `weir status`.
func (a *Agent) policyStatusLocked() *api.PolicyStatus {
	st := &a.policy
	out := &api.PolicyStatus{Loaded: st.applied, Error: st.lastErr, Maps: map[string]api.MapFill{}}
	if res := st.loaded; res != nil {
		out.Endpoints, out.Rules = len(res.Endpoints), len(res.Rules)
		for _, ep := range res.Endpoints {
			out.Entries += len(ep.Entries)
		}
		for _, err := range res.Errors {
			out.CompileErrors = append(out.CompileErrors, err.Error())
		}
	}
	if len(st.acks) > 0 {
		out.ClusterPolicies = map[string]int64{}
		for ref, ack := range st.acks {
			out.ClusterPolicies[ref] = ack.Generation
			if ack.Warning != "" {
				out.Warnings = append(out.Warnings, ref+": "+ack.Warning)
			}
		}
		slices.Sort(out.Warnings)
	}
	for name, u := range a.metrics.maps.current(mapCountEvery) {
		out.Maps[name] = api.MapFill{Entries: u.entries, Capacity: u.capacity}
	}
	return out
}

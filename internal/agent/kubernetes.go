package agent

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/cni"
	"github.com/weirnet/weir/internal/fsutil"
	"github.com/weirnet/weir/internal/k8s"
)

// ErrPodCIDRChanged means the Node's pod CIDR is not the one the agent's
// pods were addressed from; Kubernetes never changes it in place, so the
// node was re-created and its pods must go first.
var ErrPodCIDRChanged = errors.New("node pod CIDR changed")

// reportEvery is how often the agent refreshes its state on the Node even
// when nothing changed; a failed report is retried sooner, from
// reportRetryMin doubling up to reportEvery.
const (
	reportEvery = 30 * time.Second
	// slowApply is how long one pass over the cluster state may take
	// before the agent says so: policy changes wait behind it.
	slowApply      = 50 * time.Millisecond
	reportRetryMin = time.Second
)

// nodeState is what the agent last learned from the API server. It is
// kept on disk so that an agent restarted while the API server is
// unreachable programs the same datapath at once instead of waiting.
type nodeState struct {
	PodCIDR netip.Prefix `json:"podCIDR"`
	NodeIP  netip.Addr   `json:"nodeIP"`
	Peers   []api.Peer   `json:"peers"`
	// HashSeed is the cluster's (Config.HashSeed), so a restart without
	// the API server hashes as every other node does.
	HashSeed uint64 `json:"hashSeed,omitempty"`
}

func nodeStatePath(cfg Config) string { return filepath.Join(cfg.StateDir, "node.json") }

func loadNodeState(cfg Config) (nodeState, error) {
	var st nodeState
	b, err := os.ReadFile(nodeStatePath(cfg))
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("node state %s: %w", nodeStatePath(cfg), err)
	}
	return st, nil
}

func saveNodeState(cfg Config, st nodeState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(nodeStatePath(cfg), b, 0o600)
}

// peersFrom lists every node of a snapshot that can carry pod traffic.
func peersFrom(s k8s.Snapshot) []api.Peer {
	var out []api.Peer
	for _, n := range s.Nodes {
		cidr, ok := n.PodCIDR4()
		if !ok || !n.InternalIP.IsValid() {
			continue // not ready to carry pods yet
		}
		out = append(out, api.Peer{Name: n.Name, NodeIP: n.InternalIP, PodCIDR: cidr})
	}
	return out
}

// runKubernetes is Run for a Kubernetes node: learn the node from the API
// server (or from the last run), program the datapath, serve the CNI API,
// then tell the runtime and the Node that the network is ready and follow
// the cluster's changes until ctx ends.
func runKubernetes(ctx context.Context, cfg Config, log *slog.Logger) error {
	clients, err := k8s.NewClients(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	client := clients.Kube
	w := k8s.NewWatcher(client, clients.Dynamic, cfg.NodeName, 0)
	w.Start(ctx)
	if cfg, err = learnNode(ctx, w, client, cfg, log); err != nil {
		return err
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
	a.kube = &api.KubeStatus{}
	a.awaitServiceSync()
	ln, err := a.Listen()
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- a.ServeOn(ctx, ln) }()
	if cfg.CNIConfDir != "" {
		path := filepath.Join(cfg.CNIConfDir, cni.ConfListName)
		if err := fsutil.WriteFileAtomic(path, cni.ConfList(cfg.Socket, cfg.KubeProxyReplacement), 0o644); err != nil {
			return fmt.Errorf("write CNI config: %w", err)
		}
		log.Info("CNI config written; the runtime may now create pods", "path", path)
		if !cfg.CNIShared {
			go keepCNIExclusive(ctx, cfg.CNIConfDir, cniExclusiveEvery, log)
		}
	}
	a.identities = newIdentityWork(clients)
	events := record.NewBroadcaster()
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer events.Shutdown()
	rec := events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "weir-agent", Host: cfg.NodeName})
	a.metrics.maps.onRaised(mapFullEvent(rec, cfg.NodeName))
	a.mu.Lock()
	a.policyEvents = policyEvents{node: cfg.NodeName, rec: rec}
	a.serviceEvents = serviceEvents{node: cfg.NodeName, rec: rec}
	a.onEndpoint = w.Poke
	a.policy.acked = make(chan struct{}, 1)
	a.snapshot = func() (k8s.Snapshot, bool) {
		if !w.Synced() {
			return k8s.Snapshot{}, false // nothing to compile from yet: stays isolated
		}
		return w.Snapshot(), true
	}
	a.mu.Unlock()
	defer a.startPolicyStatus(ctx, w, clients.Dynamic)()
	return a.follow(ctx, client, w, served)
}

// clusterHashSeed derives the cluster's hash seed from the UID of its
// kube-system namespace: random, the same for every node, and readable
// only with the agents' cluster-wide rights. 0 (an unseeded hash, as
// outside Kubernetes) if it cannot be read within a few seconds; the
// agent still works, its NodePort picks are just predictable.
func clusterHashSeed(ctx context.Context, client kubernetes.Interface, log *slog.Logger) uint64 {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	uid, err := k8s.SystemNamespaceUID(ctx, client)
	if err != nil {
		log.Warn("no cluster hash seed: NodePort backends are picked with an unseeded hash", "err", err)
		return 0
	}
	return hashSeedOf(uid)
}

// hashSeedOf is the seed a namespace UID gives.
func hashSeedOf(uid string) uint64 {
	sum := sha256.Sum256([]byte("weir hash seed\x00" + uid))
	return binary.LittleEndian.Uint64(sum[:8])
}

// learnNode fills in the pod CIDR, node address and peers: from the state
// the last run saved if there is one (so a restart never waits for the
// API server), else from this node's Node object once it has a pod CIDR.
func learnNode(ctx context.Context, w *k8s.Watcher, client kubernetes.Interface, cfg Config, log *slog.Logger) (Config, error) {
	if saved, err := loadNodeState(cfg); err == nil && saved.PodCIDR.IsValid() {
		if cfg.PodCIDR.IsValid() && cfg.PodCIDR != saved.PodCIDR {
			return cfg, fmt.Errorf("--pod-cidr %v but this node's pods use %v (remove %s to start afresh): %w", cfg.PodCIDR, saved.PodCIDR, nodeStatePath(cfg), ErrPodCIDRChanged)
		}
		cfg.PodCIDR, cfg.Peers, cfg.HashSeed = saved.PodCIDR, saved.Peers, saved.HashSeed
		if !cfg.NodeIP.IsValid() {
			cfg.NodeIP = saved.NodeIP
		}
		if cfg.HashSeed == 0 { // saved by an agent before the seed
			cfg.HashSeed = clusterHashSeed(ctx, client, log)
		}
		log.Info("starting from the node state of the last run; the API server is followed in the background", "podCIDR", cfg.PodCIDR)
		return cfg, nil
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return cfg, err
	}
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		if w.Synced() {
			s := w.Snapshot()
			if n, ok := s.Node(cfg.NodeName); ok {
				if cidr, ok := n.PodCIDR4(); ok && (n.InternalIP.IsValid() || cfg.NodeIP.IsValid()) {
					if cfg.PodCIDR.IsValid() && cfg.PodCIDR != cidr {
						return cfg, fmt.Errorf("--pod-cidr %v but Node %s has spec.podCIDR %v: %w", cfg.PodCIDR, cfg.NodeName, cidr, ErrPodCIDRChanged)
					}
					cfg.PodCIDR, cfg.Peers = cidr, peersFrom(s)
					if !cfg.NodeIP.IsValid() {
						cfg.NodeIP = n.InternalIP
					}
					log.Info("learned this node from the API server", "podCIDR", cidr, "nodeIP", cfg.NodeIP)
					cfg.HashSeed = clusterHashSeed(ctx, client, log)
					return cfg, saveNodeState(cfg, nodeState{PodCIDR: cfg.PodCIDR, NodeIP: cfg.NodeIP, Peers: cfg.Peers, HashSeed: cfg.HashSeed})
				}
			}
		}
		select {
		case <-ctx.Done():
			return cfg, ctx.Err()
		case <-w.Changes():
		case <-tick.C:
			log.Info("waiting for Node to be registered with spec.podCIDR and an InternalIP", "synced", w.Synced())
		}
	}
}

// follow applies every change the watcher reports and keeps the Node's
// report fresh, until ctx ends or the API server socket fails. Reports and
// identity collection talk to the API server, so they run beside the loop:
// a policy change never waits for one of their round trips.
func (a *Agent) follow(ctx context.Context, client kubernetes.Interface, w *k8s.Watcher, served <-chan error) error {
	var bg sync.WaitGroup
	defer bg.Wait()
	r := newReporter(ctx, a, client, &bg)
	defer r.tick.Stop()
	gc := time.NewTicker(identityGCEvery)
	defer gc.Stop()
	var collecting atomic.Bool
	// A change to what the datapath enforces of the cluster policies is
	// reported reportAckAfter later, with those that follow it.
	var ackReport <-chan time.Time
	// learnNode may have consumed the informers' first events; ask for a
	// delivery once they have listed everything.
	go func() {
		// A missing CRD stops the sync until it is applied; say why
		// while waiting, as the informers keep retrying.
		for {
			err := w.WaitSynced(ctx)
			if err == nil {
				w.Poke()
				return
			}
			if ctx.Err() != nil {
				return
			}
			a.log.Error("cluster state not synced; waiting", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Second):
			}
		}
	}()
	r.start()
	for {
		select {
		case <-ctx.Done():
			return <-served
		case err := <-served:
			return err
		case <-r.tick.C:
			r.start()
		case ok := <-r.done:
			r.finished(ok)
		case <-a.policy.acked:
			if ackReport == nil {
				ackReport = time.After(reportAckAfter)
			}
		case <-ackReport:
			ackReport = nil
			r.start()
		case <-gc.C:
			if w.Synced() && collecting.CompareAndSwap(false, true) {
				bg.Add(1)
				go func() {
					defer bg.Done()
					defer collecting.Store(false)
					a.collectIdentities(ctx, w.Snapshot())
				}()
			}
		case <-w.ServiceChanges():
			a.applyServiceUpdates(w.ServiceUpdates)
		case <-w.Changes():
			if !w.Synced() {
				continue
			}
			start := time.Now()
			changed, err := a.applySnapshot(ctx, w.Snapshot(), w.ServiceUpdates)
			if took := time.Since(start); took > slowApply {
				a.log.Warn("applying the cluster state was slow", "took", took)
			}
			if err != nil {
				a.log.Error("apply cluster state", "err", err)
			}
			if changed {
				r.start()
			}
		}
	}
}

// reporter runs the Node reports of follow's loop one at a time in the
// background and schedules the next: soon after a failure, later after a
// success. Only the loop's goroutine calls its methods.
type reporter struct {
	ctx     context.Context
	a       *Agent
	client  kubernetes.Interface
	bg      *sync.WaitGroup
	tick    *time.Timer
	done    chan bool
	running bool
	again   bool // a report was asked for while one ran
	retry   time.Duration
}

func newReporter(ctx context.Context, a *Agent, client kubernetes.Interface, bg *sync.WaitGroup) *reporter {
	return &reporter{ctx: ctx, a: a, client: client, bg: bg, tick: time.NewTimer(reportEvery),
		done: make(chan bool, 1), retry: reportRetryMin}
}

// start begins a report, or asks for another one after the running one.
func (r *reporter) start() {
	if r.running {
		r.again = true
		return
	}
	r.running = true
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		r.done <- r.a.report(r.ctx, r.client)
	}()
}

// finished schedules the next report after one ended.
func (r *reporter) finished(ok bool) {
	r.running = false
	if r.again {
		r.again = false
		r.start()
		return
	}
	if ok {
		r.retry = reportRetryMin
		r.tick.Reset(reportEvery)
		return
	}
	r.tick.Reset(r.retry)
	r.retry = min(2*r.retry, reportEvery)
}

// applySnapshot programs the peers of a snapshot, its nodes' view of the
// Services with the Service updates serviceUpdates takes from the watcher,
// and records its pods. It reports whether the set of peers changed.
func (a *Agent) applySnapshot(ctx context.Context, s k8s.Snapshot, serviceUpdates func() []k8s.ServiceUpdate) (bool, error) {
	peers := peersFrom(s)
	a.metrics.maps.identities.Store(int64(len(s.IdentityObjects)))
	a.mu.Lock()
	defer a.mu.Unlock()
	defer func() { a.identities.allocate(ctx, a, a.applyPolicyLocked(s)) }()
	before := len(a.peers)
	changed := !samePeers(a.peers, peers, a.cfg.NodeIP)
	if changed {
		if err := a.setPeersLocked(peers); err != nil {
			return false, err
		}
		a.log.Info("peers changed", "before", before, "now", len(a.peers))
	}
	a.syncServicesLocked(s.Nodes, serviceUpdates())
	a.pods = make(map[string]k8s.Pod, len(s.Pods))
	for _, p := range s.Pods {
		a.pods[p.Key()] = p
	}
	a.kube.Synced, a.kube.LastApplied, a.kube.Pods = true, time.Now(), len(s.Pods)
	if changed {
		st := nodeState{PodCIDR: a.cfg.PodCIDR, NodeIP: a.cfg.NodeIP, Peers: peers, HashSeed: a.cfg.HashSeed}
		if err := saveNodeState(a.cfg, st); err != nil {
			return true, err
		}
	}
	return changed, nil
}

// samePeers reports whether want (which may include this node) programs
// exactly the peers have.
func samePeers(have, want []api.Peer, self netip.Addr) bool {
	m := make(map[api.Peer]bool, len(have))
	for _, p := range have {
		m[p] = true
	}
	n := 0
	for _, p := range want {
		if p.NodeIP == self {
			continue
		}
		if !m[p] {
			return false
		}
		n++
	}
	return n == len(have)
}

// report writes the agent's state on its Node and says whether it could;
// a failure is recorded and retried, never fatal: the datapath does not
// depend on the API server.
func (a *Agent) report(ctx context.Context, client kubernetes.Interface) bool {
	a.mu.Lock()
	st := k8s.AgentState{
		Ready: true, Mode: string(a.cfg.Mode), PodCIDR: a.cfg.PodCIDR.String(),
		Endpoints: len(a.ipam.List()), Peers: len(a.peers), Updated: time.Now().UTC().Truncate(time.Second),
		ClusterPolicies: a.policy.acks,
	}
	a.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := k8s.ReportNode(rctx, client, a.cfg.NodeName, st)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		if a.kube.ReportError == "" {
			a.log.Warn("cannot report to the API server; the datapath keeps running", "err", err)
		}
		a.kube.ReportError = err.Error()
		return false
	}
	if a.kube.ReportError != "" {
		a.log.Info("reporting to the API server again")
	}
	a.kube.Reported, a.kube.ReportError = time.Now(), ""
	return true
}

// cniExclusiveEvery is how often the agent looks for another CNI's
// configuration written into its directory again (by a previous CNI's
// agent still running during a migration).
const cniExclusiveEvery = 10 * time.Second

// keepCNIExclusive sets other CNIs' configurations in dir aside now and
// every period until ctx ends, so the runtime keeps attaching new pods
// with Weir. A failure is logged, not fatal: Weir's own configuration is
// in place, and only its precedence is at stake.
func keepCNIExclusive(ctx context.Context, dir string, period time.Duration, log *slog.Logger) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		moved, err := cni.SetAsideOthers(dir)
		for _, name := range moved {
			log.Warn("another CNI's config set aside: pods it attached keep their network until recreated (--cni-exclusive=false leaves them)",
				"config", filepath.Join(dir, name), "now", name+cni.SetAsideSuffix)
		}
		if err != nil {
			log.Error("setting other CNIs' configs aside failed; the runtime may attach new pods with another CNI", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

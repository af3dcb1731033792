package connectivity

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/weirnet/weir/internal/k8s"
)

// ErrChecksFailed: at least one check did not get what it wants.
var ErrChecksFailed = errors.New("connectivity checks failed")

// ErrLeftover: the test's namespace exists from an earlier run.
var ErrLeftover = errors.New("the connectivity test's namespace already exists")

// Cluster is what the test talks to.
type Cluster struct {
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface // for the ClusterNetworkPolicy; nil: that phase is skipped
	Exec    Execer
	// Flows reads an agent's flows (nil: no deciding rule is shown, and
	// denials are not checked against the record).
	Flows FlowReader
}

// Config is how the test runs.
type Config struct {
	Namespace string
	// Image runs the probes (empty: the agent DaemonSet's).
	Image string
	// External is a host:port outside the cluster accepting TCP, for the
	// pod-to-outside check (empty: skipped).
	External string
	// Timeout bounds one attempt; Settle how long a policy may take to
	// take effect (attempts repeat until then); PodTimeout how long the
	// probe pods may take to run.
	Timeout, Settle, PodTimeout time.Duration
	// Keep leaves everything in place afterwards, for inspection.
	Keep bool
	// Progress gets a line per check as it ends (nil: none).
	Progress io.Writer
}

func (c *Config) defaults() {
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.Timeout == 0 {
		c.Timeout = 3 * time.Second
	}
	if c.Settle == 0 {
		c.Settle = 30 * time.Second
	}
	if c.PodTimeout == 0 {
		c.PodTimeout = 3 * time.Minute
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
}

// Report is a run's outcome.
type Report struct {
	Namespace string   `json:"namespace"`
	Image     string   `json:"image"`
	Nodes     []string `json:"nodes"`
	Checks    []Check  `json:"checks"`
	Passed    int      `json:"passed"`
	Failed    int      `json:"failed"`
	Skipped   int      `json:"skipped"`
	// Cleanup is why cleaning up failed, if it did.
	Cleanup string `json:"cleanup,omitempty"`
}

// Run deploys the probes, runs every check and cleans up (unless
// cfg.Keep). The error is ErrChecksFailed when a check failed, or what
// kept the run from checking at all; the report holds what was checked.
func Run(ctx context.Context, c Cluster, cfg Config) (rep *Report, retErr error) {
	cfg.defaults()
	rep = &Report{Namespace: cfg.Namespace}
	_, err := c.Kube.CoreV1().Namespaces().Get(ctx, cfg.Namespace, metav1.GetOptions{})
	switch {
	case err == nil:
		return rep, fmt.Errorf("%w: %s (an interrupted run with --keep?); delete it with kubectl delete namespace %s, or pass another --namespace",
			ErrLeftover, cfg.Namespace, cfg.Namespace)
	case !apierrors.IsNotFound(err):
		return rep, fmt.Errorf("reach the API server: %w", err)
	}
	nodes, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return rep, fmt.Errorf("list nodes: %w", err)
	}
	a, b, err := pickNodes(nodes.Items)
	if err != nil {
		return rep, err
	}
	rep.Nodes = []string{a}
	if b != "" {
		rep.Nodes = append(rep.Nodes, b)
	}
	if cfg.Image == "" {
		if cfg.Image, err = agentImage(ctx, c); err != nil {
			return rep, err
		}
	}
	rep.Image = cfg.Image
	// Only what this run made is ever deleted: a namespace that appeared
	// since the check above is another's.
	if _, err := c.Kube.CoreV1().Namespaces().Create(ctx, namespace(cfg.Namespace), metav1.CreateOptions{}); err != nil {
		return rep, fmt.Errorf("create namespace %s: %w", cfg.Namespace, err)
	}
	r := &runner{c: c, cfg: cfg, rep: rep}
	if !cfg.Keep {
		defer func() {
			// Also when ctx ended (an interrupt): cleanup gets its own time.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
			defer cancel()
			if err := cleanup(cctx, c, cfg.Namespace, r.madeCNP, 2*time.Minute); err != nil {
				rep.Cleanup = err.Error()
				retErr = errors.Join(retErr, err)
			}
		}()
	}
	fmt.Fprintf(cfg.Progress, "deploying probes (%s) on %v in namespace %s\n", cfg.Image, rep.Nodes, cfg.Namespace)
	d, err := deploy(ctx, c, cfg.Namespace, a, b, cfg.Image, cfg.PodTimeout)
	if err != nil {
		return rep, err
	}
	e := &env{ns: cfg.Namespace, a: a, b: b, pods: d.pods, svc: d.svc, noEndpoints: d.noEndpoints, nodeIP: nodeIPs(nodes.Items), external: cfg.External}
	r.e = e
	r.phase(ctx, e.baseProbes(), nil)
	r.phase(ctx, e.networkPolicyProbes(), func() error {
		_, err := c.Kube.NetworkingV1().NetworkPolicies(cfg.Namespace).Create(ctx, networkPolicy(cfg.Namespace), metav1.CreateOptions{})
		return err
	})
	if c.Dynamic == nil {
		r.skipAll(e.clusterPolicyProbes(), "no dynamic client for the ClusterNetworkPolicy")
	} else {
		r.phase(ctx, e.clusterPolicyProbes(), func() error {
			_, err := c.Dynamic.Resource(k8s.ClusterPolicyResource).Create(ctx, clusterNetworkPolicy(cfg.Namespace), metav1.CreateOptions{})
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("the ClusterNetworkPolicy CRD is not installed (the chart's crds/): %w", err)
			}
			r.madeCNP = err == nil
			return err
		})
	}
	// Last: it changes what the client may reach.
	r.phase(ctx, e.egressProbes(), func() error {
		_, err := c.Kube.NetworkingV1().NetworkPolicies(cfg.Namespace).Create(ctx, egressPolicy(cfg.Namespace), metav1.CreateOptions{})
		return err
	})
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	if rep.Failed > 0 {
		return rep, fmt.Errorf("%w: %d of %d", ErrChecksFailed, rep.Failed, rep.Passed+rep.Failed)
	}
	return rep, nil
}

func nodeIPs(nodes []corev1.Node) map[string]string {
	out := map[string]string{}
	for _, n := range nodes {
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				out[n.Name] = a.Address
				break
			}
		}
	}
	return out
}

// runner runs the checks of one run into its report.
type runner struct {
	c       Cluster
	cfg     Config
	e       *env
	rep     *Report
	madeCNP bool // the run created its ClusterNetworkPolicy
}

// phase puts a policy in force (setup) and runs the phase's probes; a
// setup that fails fails every probe of the phase.
func (r *runner) phase(ctx context.Context, probes []probe, setup func() error) {
	if setup != nil {
		if err := setup(); err != nil {
			for _, p := range probes {
				r.add(Check{Name: p.name, Phase: p.phase, From: r.from(p), To: r.to(p), Want: p.want, Detail: "put the policy in force: " + err.Error()})
			}
			return
		}
	}
	for _, p := range probes {
		if ctx.Err() != nil {
			return
		}
		r.add(r.check(ctx, p))
	}
}

func (r *runner) skipAll(probes []probe, why string) {
	for _, p := range probes {
		r.add(Check{Name: p.name, Phase: p.phase, From: r.from(p), To: r.to(p), Want: p.want, Skipped: why})
	}
}

// to is where p goes as the report shows it: a pod's address with the
// pod's name and node.
func (r *runner) to(p probe) string {
	if p.to != "" {
		return p.to
	}
	host, _, err := net.SplitHostPort(p.target)
	if err != nil {
		return p.target
	}
	for name, pod := range r.e.pods {
		if pod.Status.PodIP == host && !pod.Spec.HostNetwork {
			return fmt.Sprintf("%s on %s %s", name, pod.Spec.NodeName, p.target)
		}
	}
	return p.target
}

// from is p's client as the report shows it: with its node.
func (r *runner) from(p probe) string {
	if pod := r.e.pods[p.from]; pod != nil {
		return p.from + " on " + pod.Spec.NodeName
	}
	return p.from
}

// check tries p until it gets what it wants or the settle time is up (a
// policy just created takes effect within it; with no policy change,
// the first try normally decides), then reads the deciding rule.
func (r *runner) check(ctx context.Context, p probe) Check {
	ck := Check{Name: p.name, Phase: p.phase, From: r.from(p), To: r.to(p), Want: p.want}
	if p.skip != "" {
		ck.Skipped = p.skip
		return ck
	}
	deadline := time.Now().Add(r.cfg.Settle)
	var start time.Time // of the last attempt, the one that decides
	for {
		ck.Tries++
		start = time.Now()
		res, err := attempt(ctx, r.c.Exec, r.e.ns, p, r.cfg.Timeout)
		if err != nil {
			ck.Got, ck.Detail = "error", err.Error()
		} else {
			ck.Got, ck.Millis = res.Outcome, res.Millis
			ck.Pass, ck.Detail = judge(p, res)
		}
		if ck.Pass || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Second)
	}
	if ck.Pass {
		rule, ok, why := decidingRule(ctx, r.c.Flows, p, r.e.podIP(p.from), start)
		ck.Rule = rule
		if !ok {
			ck.Pass, ck.Detail = false, why
		}
	}
	return ck
}

func (r *runner) add(ck Check) {
	r.rep.Checks = append(r.rep.Checks, ck)
	status := "FAIL"
	switch {
	case ck.Skipped != "":
		r.rep.Skipped++
		status = "skip"
	case ck.Pass:
		r.rep.Passed++
		status = "ok"
	default:
		r.rep.Failed++
	}
	fmt.Fprintf(r.cfg.Progress, "  [%s] %s: %s\n", status, ck.Name, firstNonEmpty(ck.Skipped, ck.Detail, ck.Got))
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

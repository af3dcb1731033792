// Package uninstall removes Weir from a cluster's nodes: `weir
// uninstall`. Deleting the agent DaemonSet (helm uninstall) stops the
// agents but leaves on every node what they put there: programs pinned in
// bpffs, pod veths, routes, the overlay device, the masquerade table, the
// CNI config and plugin. This stops the agents itself (their DaemonSet
// made to select no node), then runs `weir-agent uninstall` once on every
// node in a Job built from the agent's own pod template (the same image,
// host mounts, ConfigMap and node-name expansion, so the same paths),
// reports what each node removed, deletes the Jobs and, when every node
// is clean, the DaemonSet; when one is not, the agents start again. What
// is left to helm uninstall is the release's other API objects (RBAC,
// ConfigMap, the chart's Services).
package uninstall

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/weirnet/weir/internal/k8s"
)

// ErrNoAgents: no agent DaemonSet to read the nodes' paths from.
var ErrNoAgents = errors.New("no weir-agent DaemonSet")

// ErrNodesLeft: a node's cleanup did not finish.
var ErrNodesLeft = errors.New("Weir is still on some nodes")

// labelJob marks the cleanup Jobs.
const labelJob = "weir.io/uninstall"

// Node is what uninstalling did on one node.
type Node struct {
	Name string `json:"name"`
	OK   bool   `json:"ok"`
	// Log is what weir-agent uninstall printed (what it removed, or why
	// it could not).
	Log string `json:"log"`
}

// stoppedLabel is the node label the agents' DaemonSet is made to
// select while its nodes are cleaned: no node has it, so every agent pod
// ends, and the DaemonSet (and with it the agents' pod template) stays
// until every node is clean, so a run that fails can be rerun.
const stoppedLabel = "weir.io/uninstalling"

// Run stops the agents and cleans every node; progress goes to out.
// timeout bounds each wait. On success the agent DaemonSet is deleted; on
// failure its agents are started again, so the cluster keeps working and
// the run can be repeated.
func Run(ctx context.Context, kube kubernetes.Interface, timeout time.Duration, out io.Writer) (_ []Node, retErr error) {
	ds, err := agentDaemonSet(ctx, kube)
	if err != nil {
		return nil, err
	}
	ready, notReady, err := cleanableNodes(ctx, kube)
	if err != nil {
		return nil, err
	}
	if err := removeLeftoverJobs(ctx, kube, ds.Namespace, timeout); err != nil {
		return nil, err
	}
	// Before anything stops: the Jobs can be made here (RBAC, admission).
	if len(ready) > 0 {
		_, err := kube.BatchV1().Jobs(ds.Namespace).Create(ctx, cleanupJob(ds, ready[0]), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return nil, fmt.Errorf("the cleanup Jobs cannot be created in %s (nothing was changed): %w", ds.Namespace, err)
		}
	}
	fmt.Fprintf(out, "stopping the agents of DaemonSet %s/%s\n", ds.Namespace, ds.Name)
	if err := stopAgents(ctx, kube, ds, timeout); err != nil {
		return nil, errors.Join(err, startAgents(context.WithoutCancel(ctx), kube, ds))
	}
	defer func() {
		if retErr == nil {
			return
		}
		if err := startAgents(context.WithoutCancel(ctx), kube, ds); err != nil {
			retErr = errors.Join(retErr, err)
			return
		}
		fmt.Fprintln(out, "the agents were started again; fix what failed and rerun weir uninstall")
	}()
	fmt.Fprintf(out, "cleaning %d nodes with weir-agent uninstall\n", len(ready))
	defer deleteJobs(context.WithoutCancel(ctx), kube, ds.Namespace, ready)
	for _, n := range ready {
		if _, err := kube.BatchV1().Jobs(ds.Namespace).Create(ctx, cleanupJob(ds, n), metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("create the cleanup Job for node %s: %w", n, err)
		}
	}
	results := waitJobs(ctx, kube, ds.Namespace, ready, timeout)
	for _, n := range notReady {
		results = append(results, Node{Name: n, Log: "not cleaned: the node is not Ready (run weir uninstall again when it is, or weir-agent uninstall on it)"})
	}
	sort.Slice(results, func(i, j int) bool { return results[i].Name < results[j].Name })
	var failed []string
	for _, r := range results {
		if !r.OK {
			failed = append(failed, r.Name)
		}
	}
	if len(failed) > 0 {
		return results, fmt.Errorf("%w: %s (see their logs)", ErrNodesLeft, strings.Join(failed, ", "))
	}
	err = kube.AppsV1().DaemonSets(ds.Namespace).Delete(ctx, ds.Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return results, fmt.Errorf("every node is clean, but deleting DaemonSet %s/%s failed: %w", ds.Namespace, ds.Name, err)
	}
	return results, nil
}

// agentDaemonSet is the one agent DaemonSet of the cluster.
func agentDaemonSet(ctx context.Context, kube kubernetes.Interface) (*appsv1.DaemonSet, error) {
	list, err := kube.AppsV1().DaemonSets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: k8s.AgentPodSelector})
	if err != nil {
		return nil, fmt.Errorf("find the weir-agent DaemonSet: %w", err)
	}
	switch len(list.Items) {
	case 0:
		return nil, fmt.Errorf("%w (labelled %s): weir uninstall reads the nodes' paths from it, so run it before helm uninstall; "+
			"without it, run weir-agent uninstall on each node with the paths the agents had", ErrNoAgents, k8s.AgentPodSelector)
	case 1:
		return &list.Items[0], nil
	}
	return nil, fmt.Errorf("%d DaemonSets labelled %s: want one", len(list.Items), k8s.AgentPodSelector)
}

// cleanableNodes are the cluster's Linux nodes: all of them are cleaned,
// as an agent may have run on a node it no longer does (a changed node
// selector), and a node with nothing of Weir says so; a node that is not
// Ready could not run the cleanup.
func cleanableNodes(ctx context.Context, kube kubernetes.Interface) (ready, notReady []string, _ error) {
	list, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list nodes: %w", err)
	}
	for _, n := range list.Items {
		if osName := n.Labels[corev1.LabelOSStable]; osName != "" && osName != "linux" {
			continue
		}
		if nodeReady(&n) {
			ready = append(ready, n.Name)
		} else {
			notReady = append(notReady, n.Name)
		}
	}
	sort.Strings(ready)
	sort.Strings(notReady)
	return ready, notReady, nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// stopAgents makes the DaemonSet select no node and waits until its pods
// are gone: an agent still running would put back what the cleanup
// removes.
func stopAgents(ctx context.Context, kube kubernetes.Interface, ds *appsv1.DaemonSet, timeout time.Duration) error {
	patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"nodeSelector":{%q:"true"}}}}}`, stoppedLabel)
	if _, err := kube.AppsV1().DaemonSets(ds.Namespace).Patch(ctx, ds.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("stop the agents (DaemonSet %s/%s): %w", ds.Namespace, ds.Name, err)
	}
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		pods, err := kube.CoreV1().Pods(ds.Namespace).List(ctx, metav1.ListOptions{LabelSelector: k8s.AgentPodSelector})
		return err == nil && len(pods.Items) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("agent pods still there %v after stopping them: %w", timeout, err)
	}
	return nil
}

// startAgents undoes stopAgents.
func startAgents(ctx context.Context, kube kubernetes.Interface, ds *appsv1.DaemonSet) error {
	patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"nodeSelector":{%q:null}}}}}`, stoppedLabel)
	_, err := kube.AppsV1().DaemonSets(ds.Namespace).Patch(ctx, ds.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("start the agents again (remove nodeSelector %s from DaemonSet %s/%s by hand): %w", stoppedLabel, ds.Namespace, ds.Name, err)
	}
	return nil
}

// removeLeftoverJobs deletes cleanup Jobs an interrupted run left, and
// waits until they are gone: their outcome says nothing of this run.
func removeLeftoverJobs(ctx context.Context, kube kubernetes.Interface, ns string, timeout time.Duration) error {
	sel := metav1.ListOptions{LabelSelector: labelJob + "=true"}
	jobs, err := kube.BatchV1().Jobs(ns).List(ctx, sel)
	if err != nil {
		return fmt.Errorf("list cleanup Jobs: %w", err)
	}
	if len(jobs.Items) == 0 {
		return nil
	}
	for _, j := range jobs.Items {
		kube.BatchV1().Jobs(ns).Delete(ctx, j.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		jobs, err := kube.BatchV1().Jobs(ns).List(ctx, sel)
		return err == nil && len(jobs.Items) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("cleanup Jobs of an earlier run still there after %v: %w", timeout, err)
	}
	return nil
}

// cleanupJob runs weir-agent uninstall on node from the agent's pod
// template: its host mounts, ConfigMap and environment give it the
// agent's paths; the install-cni init container's CNI_BIN_DIR says where
// the plugin went.
func cleanupJob(ds *appsv1.DaemonSet, node string) *batchv1.Job {
	spec := *ds.Spec.Template.Spec.DeepCopy()
	agent := agentContainer(&spec)
	cniBin := envValue(spec.InitContainers, "CNI_BIN_DIR")
	args := []string{"uninstall", "--force"}
	if dir := mountPathOf(agent, "config"); dir != "" {
		args = append(args, "--config-dir="+dir)
	}
	// Paths the agent was given on its command line (the chart's
	// extraArgs) win over its ConfigMap, as they did for the agent.
	for _, a := range agent.Args {
		for _, flag := range []string{"--socket=", "--state-dir=", "--bpf-pin-dir=", "--cni-conf-dir=", "--cgroup-root="} {
			if strings.HasPrefix(a, flag) {
				args = append(args, a)
			}
		}
	}
	if cniBin != "" {
		args = append(args, "--cni-bin-dir="+cniBin)
	}
	// Privileged, with the mounts of the init container that made Weir's
	// mounts on the node (mount-fs: Bidirectional, so an unmount reaches
	// the node), whatever the agent itself runs with.
	mounts := agent.VolumeMounts
	if mf := initContainer(&spec, k8s.MountFSContainer); mf != nil {
		mounts = mf.VolumeMounts
	}
	c := corev1.Container{
		Name: "uninstall", Image: agent.Image, ImagePullPolicy: agent.ImagePullPolicy,
		Command: []string{"/usr/bin/weir-agent"}, Args: args,
		Env: agent.Env, VolumeMounts: mounts, SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
	}
	spec.InitContainers = nil
	spec.Containers = []corev1.Container{c}
	spec.RestartPolicy = corev1.RestartPolicyNever
	spec.NodeName = node
	spec.Affinity = nil
	spec.NodeSelector = nil
	// Every node the agent ran on, whatever its taints now.
	spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: jobName(node), Namespace: ds.Namespace, Labels: map[string]string{labelJob: "true"}},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](2),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{labelJob: "true"}},
				Spec:       spec,
			},
		},
	}
}

// jobName is the node's cleanup Job: DNS-1123, at most 63 characters,
// and with a hash of the node's name, so two long names sharing a prefix
// never share a Job.
func jobName(node string) string {
	sum := sha256.Sum256([]byte(node))
	prefix := "weir-uninstall-" + strings.ToLower(node)
	if len(prefix) > 54 {
		prefix = strings.TrimRight(prefix[:54], "-.")
	}
	return fmt.Sprintf("%s-%x", prefix, sum[:4])
}

func agentContainer(spec *corev1.PodSpec) *corev1.Container {
	for i := range spec.Containers {
		if spec.Containers[i].Name == k8s.AgentContainer {
			return &spec.Containers[i]
		}
	}
	return &spec.Containers[0]
}

func initContainer(spec *corev1.PodSpec, name string) *corev1.Container {
	for i := range spec.InitContainers {
		if spec.InitContainers[i].Name == name {
			return &spec.InitContainers[i]
		}
	}
	return nil
}

func envValue(cs []corev1.Container, name string) string {
	for _, c := range cs {
		for _, e := range c.Env {
			if e.Name == name {
				return e.Value
			}
		}
	}
	return ""
}

func mountPathOf(c *corev1.Container, volume string) string {
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return m.MountPath
		}
	}
	return ""
}

// waitJobs waits until every node's Job succeeded or failed, and collects
// its pod's log.
func waitJobs(ctx context.Context, kube kubernetes.Interface, ns string, nodes []string, timeout time.Duration) []Node {
	out := make([]Node, len(nodes))
	done := make([]bool, len(nodes))
	_ = wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		all := true
		for i, n := range nodes {
			if done[i] {
				continue
			}
			job, err := kube.BatchV1().Jobs(ns).Get(ctx, jobName(n), metav1.GetOptions{})
			if err != nil {
				all = false
				continue
			}
			switch {
			case job.Status.Succeeded > 0:
				out[i], done[i] = Node{Name: n, OK: true, Log: jobLog(ctx, kube, ns, job.Name)}, true
			case jobFailed(job):
				out[i], done[i] = Node{Name: n, Log: jobLog(ctx, kube, ns, job.Name)}, true
			default:
				all = false
			}
		}
		return all, nil
	})
	for i, n := range nodes {
		if !done[i] {
			out[i] = Node{Name: n, Log: fmt.Sprintf("not finished after %v: %s", timeout, jobLog(ctx, kube, ns, jobName(n)))}
		}
	}
	return out
}

func jobFailed(job *batchv1.Job) bool {
	for _, c := range job.Status.Conditions {
		if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// jobLog is the log of the Job's newest pod.
func jobLog(ctx context.Context, kube kubernetes.Interface, ns, job string) string {
	pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + job})
	if err != nil || len(pods.Items) == 0 {
		return "(no pod)"
	}
	sort.Slice(pods.Items, func(i, j int) bool {
		return pods.Items[i].CreationTimestamp.Before(&pods.Items[j].CreationTimestamp)
	})
	p := pods.Items[len(pods.Items)-1]
	b, err := kube.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		return fmt.Sprintf("(pod %s is %s; no log: %v)", p.Name, p.Status.Phase, err)
	}
	return string(bytes.TrimSpace(b))
}

// deleteJobs deletes the nodes' cleanup Jobs and waits (a minute at
// most) until their pods are gone too.
func deleteJobs(ctx context.Context, kube kubernetes.Interface, ns string, nodes []string) {
	for _, n := range nodes {
		kube.BatchV1().Jobs(ns).Delete(ctx, jobName(n), metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
	}
	_ = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: labelJob + "=true"})
		return err == nil && len(pods.Items) == 0, nil
	})
}

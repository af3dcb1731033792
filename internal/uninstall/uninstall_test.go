package uninstall

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/weirnet/weir/internal/k8s"
)

// chartDaemonSet is the agent DaemonSet of deploy/weir.yaml, the chart
// rendered with its defaults.
func chartDaemonSet(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	_, file, _, _ := goruntime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "deploy", "weir.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range bytes.Split(b, []byte("\n---")) {
		if !bytes.Contains(doc, []byte("kind: DaemonSet")) {
			continue
		}
		var ds appsv1.DaemonSet
		if err := yaml.Unmarshal(doc, &ds); err != nil {
			t.Fatal(err)
		}
		return &ds
	}
	t.Fatal("deploy/weir.yaml has no DaemonSet")
	return nil
}

// The cleanup Job is the agent's pod on one node, running weir-agent
// uninstall with the agent's paths: its ConfigMap, host mounts, node-name
// environment, and install-cni's plugin directory.
func TestCleanupJobIsTheAgentsPod(t *testing.T) {
	ds := chartDaemonSet(t)
	job := cleanupJob(ds, "worker-1")
	spec := job.Spec.Template.Spec
	agent := ds.Spec.Template.Spec.Containers[0]
	if spec.NodeName != "worker-1" || spec.RestartPolicy != corev1.RestartPolicyNever || len(spec.InitContainers) != 0 || len(spec.Containers) != 1 {
		t.Fatalf("job pod: node %q restart %q, %d init and %d containers", spec.NodeName, spec.RestartPolicy, len(spec.InitContainers), len(spec.Containers))
	}
	c := spec.Containers[0]
	want := []string{"uninstall", "--force", "--config-dir=/etc/weir/config", "--cni-bin-dir=/opt/cni/bin"}
	if c.Image != agent.Image || !slices.Equal(c.Command, []string{"/usr/bin/weir-agent"}) || !slices.Equal(c.Args, want) {
		t.Errorf("container: image %q command %q args %q; want %q, weir-agent, %q", c.Image, c.Command, c.Args, agent.Image, want)
	}
	if !spec.HostNetwork || c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("the cleanup runs on the node's network, privileged, as the agent does")
	}
	// The mounts of mount-fs, which made Weir's mounts: Bidirectional, so
	// the cgroup2 it unmounts goes from the node too.
	mountFS := ds.Spec.Template.Spec.InitContainers[0]
	if mountFS.Name != k8s.MountFSContainer {
		t.Fatalf("the first init container is %q, want %s", mountFS.Name, k8s.MountFSContainer)
	}
	if len(spec.Volumes) != len(ds.Spec.Template.Spec.Volumes) || !slices.EqualFunc(c.VolumeMounts, mountFS.VolumeMounts, func(a, b corev1.VolumeMount) bool {
		return a.Name == b.Name && a.MountPath == b.MountPath && ptr.Deref(a.MountPropagation, "") == ptr.Deref(b.MountPropagation, "")
	}) {
		t.Errorf("volumes %d/%d, mounts %v: want %s's %v", len(spec.Volumes), len(ds.Spec.Template.Spec.Volumes), c.VolumeMounts, k8s.MountFSContainer, mountFS.VolumeMounts)
	}
	hasEnv := false
	for _, e := range c.Env {
		hasEnv = hasEnv || (e.Name == "NODE_NAME" && e.ValueFrom != nil)
	}
	if !hasEnv {
		t.Error("no NODE_NAME: the paths' $(NODE_NAME) would not expand")
	}
	long := strings.Repeat("n", 80)
	if a, b := jobName(long+"a"), jobName(long+"b"); len(a) > 63 || a == b {
		t.Errorf("job names %q and %q: want distinct, at most 63 characters", a, b)
	}
}

// newFakeCluster is an API with the chart's DaemonSet, its pods on two
// nodes, and a kubelet's worth of behaviour: deleting the DaemonSet
// deletes its pods, and each Job runs to the given outcome with a log.
func newFakeCluster(t *testing.T, failOn string) (*fake.Clientset, *appsv1.DaemonSet) {
	t.Helper()
	ds := chartDaemonSet(t)
	kube := fake.NewClientset()
	ctx := context.Background()
	if _, err := kube.AppsV1().DaemonSets(ds.Namespace).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"n1", "n2"} {
		kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}, metav1.CreateOptions{})
		kube.CoreV1().Pods(ds.Namespace).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "weir-agent-" + n, Namespace: ds.Namespace, Labels: ds.Spec.Template.Labels},
			Spec:       corev1.PodSpec{NodeName: n}, Status: corev1.PodStatus{Phase: corev1.PodRunning},
		}, metav1.CreateOptions{})
	}
	// The DaemonSet controller: a node selector no node matches ends the
	// agent pods; removing it starts them again.
	kube.PrependReactor("patch", "daemonsets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		patch := string(a.(k8stesting.PatchAction).GetPatch())
		for _, n := range []string{"n1", "n2"} {
			name := "weir-agent-" + n
			if strings.Contains(patch, `"true"`) {
				kube.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), ds.Namespace, name)
			} else {
				kube.Tracker().Add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ds.Namespace, Labels: ds.Spec.Template.Labels},
					Spec: corev1.PodSpec{NodeName: n}, Status: corev1.PodStatus{Phase: corev1.PodRunning}})
			}
		}
		return false, nil, nil
	})
	kube.PrependReactor("create", "jobs", func(a k8stesting.Action) (bool, runtime.Object, error) {
		job := a.(k8stesting.CreateAction).GetObject().(*batchv1.Job)
		if len(a.(k8stesting.CreateActionImpl).GetCreateOptions().DryRun) > 0 {
			return true, job, nil // checked, not made
		}
		if job.Spec.Template.Spec.NodeName == failOn {
			job.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue}}
		} else {
			job.Status.Succeeded = 1
		}
		kube.Tracker().Add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: job.Name + "-x", Namespace: job.Namespace,
			Labels: map[string]string{"job-name": job.Name}}})
		return false, nil, nil
	})
	return kube, ds
}

func TestRunStopsAgentsCleansEveryNodeAndDeletesItsJobs(t *testing.T) {
	kube, ds := newFakeCluster(t, "")
	var progress bytes.Buffer
	nodes, err := Run(context.Background(), kube, 5*time.Second, &progress)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, progress.String())
	}
	if len(nodes) != 2 || !nodes[0].OK || !nodes[1].OK || nodes[0].Name != "n1" {
		t.Errorf("nodes %+v, want n1 and n2 clean", nodes)
	}
	ctx := context.Background()
	if _, err := kube.AppsV1().DaemonSets(ds.Namespace).Get(ctx, ds.Name, metav1.GetOptions{}); err == nil {
		t.Error("the agent DaemonSet is still there")
	}
	jobs, _ := kube.BatchV1().Jobs(ds.Namespace).List(ctx, metav1.ListOptions{})
	if len(jobs.Items) != 0 {
		t.Errorf("%d cleanup Jobs left", len(jobs.Items))
	}
	// The Jobs ran after the agents were stopped (an agent still running
	// would put back what the cleanup removes), and the DaemonSet went
	// only once every node was clean.
	var order []string
	for _, a := range kube.Actions() {
		res := a.GetResource().Resource
		switch {
		case a.GetVerb() == "patch" && res == "daemonsets", a.GetVerb() == "delete" && res == "daemonsets":
			order = append(order, a.GetVerb()+" "+res)
		case a.GetVerb() == "create" && res == "jobs" && len(a.(k8stesting.CreateActionImpl).GetCreateOptions().DryRun) == 0:
			order = append(order, "create jobs")
		}
	}
	if want := []string{"patch daemonsets", "create jobs", "create jobs", "delete daemonsets"}; !slices.Equal(order, want) {
		t.Errorf("actions %v, want %v", order, want)
	}
}

func TestRunNamesTheNodesLeft(t *testing.T) {
	kube, _ := newFakeCluster(t, "n2")
	nodes, err := Run(context.Background(), kube, 5*time.Second, &bytes.Buffer{})
	if !errors.Is(err, ErrNodesLeft) || !strings.Contains(err.Error(), "n2") || strings.Contains(err.Error(), "n1") {
		t.Fatalf("run: %v, want ErrNodesLeft naming n2 alone", err)
	}
	if nodes[1].OK || !nodes[0].OK {
		t.Errorf("nodes %+v", nodes)
	}
	// The agents run again, their DaemonSet kept for a rerun; no Job is
	// left.
	ctx := context.Background()
	ds, err := kube.AppsV1().DaemonSets("kube-system").Get(ctx, "weir-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the DaemonSet is gone after a failed run: %v", err)
	}
	pods, _ := kube.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=weir-agent"})
	if len(pods.Items) != 2 {
		t.Errorf("%d agent pods after a failed run, want both started again (DaemonSet %v)", len(pods.Items), ds.Spec.Template.Spec.NodeSelector)
	}
	jobs, _ := kube.BatchV1().Jobs("kube-system").List(ctx, metav1.ListOptions{})
	if len(jobs.Items) != 0 {
		t.Errorf("%d Jobs left", len(jobs.Items))
	}
}

// Jobs an interrupted run left are deleted before this run's, whose
// outcome alone counts; a Job that cannot be made stops the run before
// any agent stops.
func TestRunReplacesLeftoverJobsAndChecksFirst(t *testing.T) {
	kube, ds := newFakeCluster(t, "")
	ctx := context.Background()
	stale := cleanupJob(ds, "n1")
	stale.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue}}
	if err := kube.Tracker().Add(stale); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(ctx, kube, 5*time.Second, &bytes.Buffer{}); err != nil {
		t.Fatalf("run over a leftover failed Job: %v", err)
	}

	kube, _ = newFakeCluster(t, "")
	kube.PrependReactor("create", "jobs", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("jobs.batch is forbidden")
	})
	_, err := Run(ctx, kube, 5*time.Second, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "nothing was changed") {
		t.Fatalf("run where Jobs are forbidden: %v", err)
	}
	for _, a := range kube.Actions() {
		if a.GetVerb() == "patch" || a.GetVerb() == "delete" {
			t.Errorf("a refused run still did %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
}

func TestRunWithoutAgentsSaysWhatToDo(t *testing.T) {
	_, err := Run(context.Background(), fake.NewClientset(), time.Second, &bytes.Buffer{})
	if !errors.Is(err, ErrNoAgents) || !strings.Contains(err.Error(), "before helm uninstall") {
		t.Fatalf("run without a DaemonSet: %v", err)
	}
}

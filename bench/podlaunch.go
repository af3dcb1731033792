package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/lab"
)

// Pod-launch setups: the same cluster, pods of the default runtime handler
// get Weir, pods of the "bridge" RuntimeClass the reference bridge plugin.
const (
	launchWeir   = "weir"
	launchBridge = "bridge"
	launchLab    = "wbench-pl"
)

// runPodLaunch measures, pod by pod, the time from create to Ready and
// the CNI ADD inside it, Weir and the bridge plugin alternating on one
// cluster (study 001, Fig. 7). The ADD is timed by a wrapper the runtime
// calls in place of each plugin (bench/cnitimer).
func runPodLaunch(ctx context.Context, o options, out io.Writer) (retErr error) {
	binDir, err := filepath.Abs(o.binDir)
	if err != nil {
		return err
	}
	timers, err := os.MkdirTemp("", "weir-bench-cni-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(timers)
	if err := installTimers(ctx, timers, binDir); err != nil {
		return err
	}
	lab.Down(ctx, launchLab, io.Discard) // what an interrupted run left
	res := &result{Scenario: "pod-launch", Command: invocation, Commit: sourceCommit(),
		Started: time.Now().UTC().Format(time.RFC3339), Machine: machine(), Reps: o.pods}
	st, err := lab.Up(ctx, lab.Config{
		Name: launchLab, Nodes: 2, Mode: datapath.ModeVXLAN, BinDir: binDir, Kubernetes: true,
		AgentMode: lab.AgentHost, BridgeRuntime: true, CNIBinDir: timers,
		// The Service proxy the published runs had (the lab's default
		// then); pod launch does not go through it.
		KubeProxy: lab.KubeProxyNFTables,
	}, out)
	if err != nil {
		return err
	}
	defer func() {
		if err := lab.Down(context.Background(), launchLab, io.Discard); err != nil && retErr == nil {
			retErr = err
		}
	}()
	c, err := st.Client()
	if err != nil {
		return err
	}
	ns := "launch"
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := waitServiceAccount(ctx, c, ns); err != nil {
		return err
	}
	// One warm-up pod per setup: the first pod of a node pays for image
	// unpacking and the first tcx attachment's RCU wait.
	for _, s := range []string{launchWeir, launchBridge} {
		for _, node := range []string{"n1", "n2"} {
			if _, err := launchPod(ctx, c, ns, fmt.Sprintf("warm-%s-%s", s, node), s, node); err != nil {
				return err
			}
		}
	}
	fmt.Fprintf(out, "launching %d pods per setup, one at a time, Weir and bridge alternating\n", o.pods)
	for i := 0; i < o.pods; i++ {
		order := []string{launchWeir, launchBridge}
		if i%2 == 1 {
			order = []string{launchBridge, launchWeir}
		}
		for _, s := range order {
			node := []string{"n1", "n2"}[i%2]
			d, err := launchPod(ctx, c, ns, fmt.Sprintf("%s-%03d", s, i), s, node)
			if err != nil {
				return err
			}
			res.Samples = append(res.Samples, sample{Setup: s, Path: "launch", Metric: "ready_ms", Rep: i, Value: ms(d)})
		}
	}
	if err := c.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		return err
	}
	if err := waitGone(ctx, c, ns, 3*time.Minute); err != nil {
		return err
	}
	// kubelet stops sandboxes (and so calls CNI DEL) after the API objects
	// are gone; wait for every measured pod's DEL.
	if err := waitDELs(filepath.Join(timers, "timing.jsonl"), 2*o.pods, 2*time.Minute); err != nil {
		return err
	}
	if err := addCNISamples(filepath.Join(timers, "timing.jsonl"), res); err != nil {
		return err
	}
	res.Finished = time.Now().UTC().Format(time.RFC3339)
	res.summarise()
	return res.write(o.out, out)
}

// installTimers fills dir with the timing wrapper under every plugin name
// the lab's runtimes call, and tells it where the real plugins are.
func installTimers(ctx context.Context, dir, binDir string) error {
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, "cnitimer"), "./bench/cnitimer")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build cnitimer: %w: %s", err, out)
	}
	ref, err := lab.ReferencePlugins(ctx)
	if err != nil {
		return err
	}
	for _, p := range []string{"weir-cni", "bridge", "host-local", "loopback", "portmap"} {
		if err := os.Symlink("cnitimer", filepath.Join(dir, p)); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, "real-dirs"), []byte(binDir+"\n"+ref+"\n"), 0o644)
}

// launchPod creates one pod on node and returns the time from the create
// call to the API server reporting it Ready, as a client sees it.
func launchPod(ctx context.Context, c kubernetes.Interface, ns, name, setup, node string) (time.Duration, error) {
	zero := int64(0)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"bench": "pod-launch", "setup": setup}},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": node},
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{
				Name: "pause", Image: lab.AgnhostImage, ImagePullPolicy: corev1.PullNever, Args: []string{"pause"},
			}},
		},
	}
	if setup == launchBridge {
		rc := "bridge"
		pod.Spec.RuntimeClassName = &rc
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	w, err := c.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		return 0, err
	}
	defer w.Stop()
	start := time.Now()
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return 0, fmt.Errorf("create pod %s: %w", name, err)
	}
	for ev := range w.ResultChan() {
		if ev.Type == watch.Error {
			return 0, fmt.Errorf("watch pod %s: %v", name, ev.Object)
		}
		p, ok := ev.Object.(*corev1.Pod)
		if !ok {
			continue
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return time.Since(start), nil
			}
		}
	}
	return 0, fmt.Errorf("pod %s not Ready after 2m: %w", name, ctx.Err())
}

func waitDELs(path string, want int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		n := 0
		for _, l := range strings.Split(string(b), "\n") {
			var r struct{ Plugin, Command, Pod string }
			if json.Unmarshal([]byte(l), &r) == nil && r.Command == "DEL" && (r.Plugin == "weir-cni" || r.Plugin == "bridge") {
				if _, _, ok := parseLaunchName(r.Pod); ok {
					n++
				}
			}
		}
		if n >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d CNI DELs after %s", n, want, timeout)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func waitServiceAccount(ctx context.Context, c kubernetes.Interface, ns string) error {
	for i := 0; i < 100; i++ {
		if _, err := c.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("namespace %s got no default service account", ns)
}

func waitGone(ctx context.Context, c kubernetes.Interface, ns string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if _, err := c.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("namespace %s still there after %s", ns, timeout)
}

// addCNISamples turns the wrapper's records of the measured pods into
// ADD and DEL samples and each pod's share of its launch spent in ADD.
func addCNISamples(path string, res *result) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("CNI timings: %w", err)
	}
	defer f.Close()
	ready := map[string]float64{} // pod name -> ready_ms
	for _, s := range res.Samples {
		ready[fmt.Sprintf("%s-%03d", s.Setup, s.Rep)] = s.Value
	}
	top := map[string]bool{"weir-cni": true, "bridge": true}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r struct {
			Plugin, Command, Pod string
			Ms                   float64
			OK                   bool
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil || !top[r.Plugin] {
			continue
		}
		setup, rep, ok := parseLaunchName(r.Pod)
		if !ok {
			continue
		}
		if !r.OK {
			return fmt.Errorf("CNI %s of pod %s failed", r.Command, r.Pod)
		}
		switch r.Command {
		case "ADD":
			res.Samples = append(res.Samples, sample{Setup: setup, Path: "launch", Metric: "add_ms", Rep: rep, Value: r.Ms})
			if total := ready[r.Pod]; total > 0 {
				res.Samples = append(res.Samples, sample{Setup: setup, Path: "launch", Metric: "add_share_pct", Rep: rep, Value: 100 * r.Ms / total})
			}
		case "DEL":
			res.Samples = append(res.Samples, sample{Setup: setup, Path: "launch", Metric: "del_ms", Rep: rep, Value: r.Ms})
		}
	}
	return sc.Err()
}

func parseLaunchName(pod string) (string, int, bool) {
	setup, num, ok := strings.Cut(pod, "-")
	if !ok || (setup != launchWeir && setup != launchBridge) {
		return "", 0, false
	}
	var rep int
	if _, err := fmt.Sscanf(num, "%d", &rep); err != nil {
		return "", 0, false
	}
	return setup, rep, true
}

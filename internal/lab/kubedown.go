package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// downKubernetes removes a Kubernetes lab's cluster: kubelets first so
// nothing restarts pods; then every pod sandbox through the CRI, so each
// gets its CNI DEL and Weir releases its address; then the other servers
// in reverse start order. Whatever a crash left behind is then found by
// where it lives: shims serving this lab's containerd sockets, processes
// in this lab's cgroups, mounts under this lab's directories.
func (st *State) downKubernetes() []error {
	var errs []error
	k := st.Kube
	for _, p := range k.Procs {
		if strings.HasSuffix(p.Name, "/kubelet") {
			errs = append(errs, p.stop(10*time.Second))
		}
	}
	for i := range st.Nodes {
		n := &st.Nodes[i]
		kp := st.kubePaths(n)
		if pr, err := st.proc(n.Name + "/containerd"); err == nil && pr.Alive() {
			errs = append(errs, removeSandboxes(kp.containerdSock, 30*time.Second))
		}
	}
	for i := len(k.Procs) - 1; i >= 0; i-- {
		errs = append(errs, k.Procs[i].stop(10*time.Second))
	}
	for i := range st.Nodes {
		kp := st.kubePaths(&st.Nodes[i])
		errs = append(errs, killShims(kp.containerdSock))
		errs = append(errs, removeCgroupRoot(kp.cgroupRoot))
	}
	errs = append(errs, unmountUnder(st.RunDir, k.DataDir))
	if err := removeUnmounted(k.DataDir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", k.DataDir, err))
	}
	return errs
}

// removeSandboxes stops and removes every pod sandbox of one containerd,
// giving each sandbox up to timeout (a node of the policy-scale benchmark
// holds over a hundred, too many for one shared deadline).
func removeSandboxes(sock string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to containerd %s: %w", sock, err)
	}
	defer conn.Close()
	rt := cri.NewRuntimeServiceClient(conn)
	list, err := rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("list pod sandboxes of %s: %w", sock, err)
	}
	// Pods on the pod network first, while the agent (itself a pod on the
	// node's network, in DaemonSet mode) still answers their CNI DELs.
	hostNet := map[string]bool{}
	for _, sb := range list.Items {
		st, err := rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: sb.Id})
		if err == nil && st.Status.GetLinux().GetNamespaces().GetOptions().GetNetwork() == cri.NamespaceMode_NODE {
			hostNet[sb.Id] = true
		}
	}
	sort.SliceStable(list.Items, func(i, j int) bool { return !hostNet[list.Items[i].Id] && hostNet[list.Items[j].Id] })
	var errs []error
	for _, sb := range list.Items {
		errs = append(errs, removeSandbox(rt, sb, timeout))
	}
	return errors.Join(errs...)
}

func removeSandbox(rt cri.RuntimeServiceClient, sb *cri.PodSandbox, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if _, err := rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
		return fmt.Errorf("stop sandbox %s (%s/%s): %w", sb.Id[:12], sb.Metadata.Namespace, sb.Metadata.Name, err)
	}
	if _, err := rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
		return fmt.Errorf("remove sandbox %s: %w", sb.Id[:12], err)
	}
	return nil
}

// killShims ends the runc shims that serve the containerd at sock. Shims
// outlive containerd by design; these are found by the socket path they
// were started with, which only this lab uses.
func killShims(sock string) error {
	for _, pid := range procsMatching(func(args []string) bool {
		return filepath.Base(args[0]) == "containerd-shim-runc-v2" && hasArgPair(args, "-address", sock)
	}) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	return nil
}

func hasArgPair(args []string, flag, value string) bool {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag && args[i+1] == value {
			return true
		}
	}
	return false
}

// removeCgroupRoot kills every process left in a node's cgroups and
// removes them, deepest first. Besides the v1 hierarchies kubelet was
// given a root in, it walks the hybrid cgroup2 mount ("unified"):
// systemd-style runtimes make the same paths there, and nothing else
// would remove them.
func removeCgroupRoot(root string) error {
	var errs []error
	for _, c := range append(cgroupControllers[:len(cgroupControllers):len(cgroupControllers)], "unified") {
		top := filepath.Join("/sys/fs/cgroup", c, root)
		if _, err := os.Stat(top); err != nil {
			continue
		}
		var dirs []string
		filepath.WalkDir(top, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		sort.Sort(sort.Reverse(sort.StringSlice(dirs)))
		for _, d := range dirs {
			killCgroup(d)
		}
		for _, d := range dirs {
			var err error
			for try := 0; try < 50; try++ {
				if err = os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) {
					err = nil
					break
				}
				killCgroup(d)
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

func killCgroup(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// unmountUnder unmounts every mount point below the given directories,
// deepest first: kubelet's volume mounts, containerd's rootfs and shm
// mounts, pod network namespaces.
func unmountUnder(dirs ...string) error {
	points, err := mountPointsUnder(dirs...)
	if err != nil {
		return err
	}
	var errs []error
	for _, mp := range points {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// mountPointsUnder lists the mount points at or below dirs, deepest
// first.
func mountPointsUnder(dirs ...string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		for _, d := range dirs {
			if d != "" && (mp == d || strings.HasPrefix(mp, d+"/")) {
				points = append(points, mp)
			}
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	return points, sc.Err()
}

// removeUnmounted removes dir and everything in it, unless something is
// still mounted at or below it: removing across a mount would empty what
// it holds (a cgroup2 mount of the machine's hierarchy would lose every
// empty cgroup of the host).
func removeUnmounted(dir string) error {
	points, err := mountPointsUnder(dir)
	if err != nil {
		return err
	}
	if len(points) > 0 {
		return fmt.Errorf("%s not removed: still mounted below it: %v", dir, points)
	}
	return os.RemoveAll(dir)
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/weirnet/weir/internal/datapath/bpffs"
)

// Down removes a lab: its agents (by recorded PID), every namespace whose
// name carries the lab's prefix, its pins and run directory, and the bpffs
// mount if Weir made it and nothing else uses it any more (labs run side
// by side: the last one down takes it away, whichever mounted it). It works from
// whatever state is left, so it also cleans up after a crashed Up.
func Down(ctx context.Context, name string, out io.Writer) error {
	var errs []error
	st, err := Load(name)
	if err == nil && st.Kube != nil {
		errs = append(errs, st.downKubernetes()...)
	}
	if err == nil {
		for _, n := range st.Nodes {
			if err := stopProcess(n.AgentPID, "weir-agent", 10*time.Second); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// What a crashed Up may have left without recording it.
	if leftovers, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", name+"-*")); len(leftovers) > 0 {
		roots := map[string]bool{}
		for _, l := range leftovers {
			roots["/"+filepath.Base(l)] = true
		}
		for r := range roots {
			errs = append(errs, removeCgroupRoot(r))
		}
	}
	errs = append(errs, unmountUnder(RunDir(name), DataDir(name)))
	if err := removeUnmounted(DataDir(name)); err != nil {
		errs = append(errs, err)
	}
	spaces, err := listNetNS(name + "-")
	if err != nil {
		errs = append(errs, err)
	}
	for _, s := range spaces {
		errs = append(errs, deleteNetNS(s))
	}
	if err := os.RemoveAll(pinRoot(name)); err != nil {
		errs = append(errs, fmt.Errorf("remove pins: %w", err))
	}
	errs = append(errs, bpffs.Release())
	if err := removeUnmounted(RunDir(name)); err != nil {
		errs = append(errs, err)
	}
	fmt.Fprintf(out, "lab %s removed (%d namespaces)\n", name, len(spaces))
	return errors.Join(errs...)
}

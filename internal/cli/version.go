package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/lab"
	"github.com/weirnet/weir/internal/version"
)

// Versions is what `weir version -o json` prints: the build of each Weir
// binary it could reach, and the kernel it runs on.
type Versions struct {
	CLI    version.Info   `json:"cli"`
	Agents []AgentVersion `json:"agents"`
	CNI    BinaryVersion  `json:"cni"`
	Kernel KernelFeatures `json:"kernel"`
}

// AgentVersion is one agent's build, or why it could not be asked.
type AgentVersion struct {
	Node  string        `json:"node,omitempty"`
	At    string        `json:"at"` // the socket, or the agent pod
	Info  *version.Info `json:"info,omitempty"`
	Error string        `json:"error,omitempty"`
}

// BinaryVersion is the build of a binary on this node, or why it could
// not be read.
type BinaryVersion struct {
	Path  string        `json:"path"`
	Info  *version.Info `json:"info,omitempty"`
	Error string        `json:"error,omitempty"`
}

// KernelFeatures is the kernel's release and, when asked, the preflight
// checks that need no program load.
type KernelFeatures struct {
	Release string                 `json:"release"`
	Checks  []datapath.CheckResult `json:"checks,omitempty"`
}

// NewVersionCommand is `weir version`.
func NewVersionCommand() *cobra.Command {
	var cniBinDir, output string
	var target agentTarget
	var features bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Show the version of the CLI, the node's agent and CNI plugin, and the kernel's features",
		Example: "  weir version\n  weir version --lab weir-lab -o json\n" +
			"  sudo weir version --features   # with weir preflight's kernel checks, but for loading Weir's programs",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			agents, err := target.agents(cmd.Context())
			if err != nil {
				return err
			}
			if target.labName != "" && !cmd.Flags().Changed("cni-bin-dir") {
				// A lab's nodes keep their plugins under its run directory.
				if dir, err := labCNIBinDir(target.labName); err == nil {
					cniBinDir = dir
				}
			}
			v := collectVersions(cmd.Context(), agents, filepath.Join(cniBinDir, "weir-cni"), features)
			if output == "json" {
				return writeIndentedJSON(cmd.OutOrStdout(), v)
			}
			return printVersions(v, cmd.OutOrStdout())
		},
	}
	fl := cmd.Flags()
	target.register(fl, "ask every node agent of this lab instead of --socket")
	fl.StringVar(&cniBinDir, "cni-bin-dir", "/opt/cni/bin", "where the node's CNI plugins are")
	fl.BoolVar(&features, "features", false, "also check the kernel's features (root; see weir preflight)")
	fl.StringVarP(&output, "output", "o", "", "json: as JSON; empty: a table")
	return cmd
}

// labCNIBinDir is where the first node of a lab finds its CNI plugins.
func labCNIBinDir(labName string) (string, error) {
	st, err := lab.Load(labName)
	if err != nil {
		return "", err
	}
	if len(st.Nodes) == 0 || st.Kube == nil {
		return st.Config.BinDir, nil
	}
	_, bin := st.CNIDirs(&st.Nodes[0])
	return bin, nil
}

// collectVersions asks each agent and the CNI plugin which build they are;
// one that cannot be asked is reported, not fatal.
func collectVersions(ctx context.Context, agents []agentConn, cniPath string, features bool) Versions {
	v := Versions{CLI: version.Get(), CNI: cniVersion(ctx, cniPath), Kernel: KernelFeatures{Release: kernelRelease()}}
	for _, ag := range agents {
		a := AgentVersion{Node: ag.node, At: ag.where}
		if ag.err != nil {
			a.Error = ag.err.Error()
			v.Agents = append(v.Agents, a)
			continue
		}
		actx, cancel := context.WithTimeout(ctx, 15*time.Second)
		info, err := ag.client.Version(actx)
		cancel()
		if err != nil {
			a.Error = err.Error()
		} else {
			a.Info = info
		}
		v.Agents = append(v.Agents, a)
	}
	if features {
		var quick []datapath.Check
		for _, c := range datapath.PreflightChecks(datapath.DefaultPreflightPaths, datapath.ModeVXLAN) {
			if c.Name != datapath.CheckPrograms {
				quick = append(quick, c)
			}
		}
		v.Kernel.Checks = datapath.RunPreflight(quick)
	}
	return v
}

// cniVersion runs the plugin without CNI_COMMAND, which makes it print
// its About: a line for people, then its version.Info as JSON.
func cniVersion(ctx context.Context, path string) BinaryVersion {
	b := BinaryVersion{Path: path}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = []string{} // no CNI_COMMAND: the plugin says what it is
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		b.Error = err.Error()
		return b
	}
	// skel prints the supported CNI versions after it.
	var info version.Info
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &info) == nil {
			break
		}
	}
	if info.Version == "" {
		b.Error = "not a weir-cni that reports its version: " + strings.TrimSpace(stderr.String())
		return b
	}
	b.Info = &info
	return b
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown: " + err.Error()
	}
	return unix.ByteSliceToString(u.Release[:])
}

// printVersions writes v as a table, and says when the builds differ.
func printVersions(v Versions, out io.Writer) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "COMPONENT\tWHERE\tVERSION")
	fmt.Fprintf(w, "weir (CLI)\t\t%s\n", v.CLI)
	builds := map[string]bool{v.CLI.Version + v.CLI.Commit: true}
	for _, a := range v.Agents {
		where := a.At
		if a.Node != "" {
			where = a.Node + " " + a.At
		}
		if a.Info == nil {
			fmt.Fprintf(w, "weir-agent\t%s\tnot reachable: %s\n", where, a.Error)
			continue
		}
		builds[a.Info.Version+a.Info.Commit] = true
		fmt.Fprintf(w, "weir-agent\t%s\t%s\n", where, a.Info)
	}
	if v.CNI.Info == nil {
		fmt.Fprintf(w, "weir-cni\t%s\tnot readable: %s\n", v.CNI.Path, v.CNI.Error)
	} else {
		builds[v.CNI.Info.Version+v.CNI.Info.Commit] = true
		fmt.Fprintf(w, "weir-cni\t%s\t%s\n", v.CNI.Path, v.CNI.Info)
	}
	fmt.Fprintf(w, "kernel\t\t%s%s\n", v.Kernel.Release, featureSummary(v.Kernel.Checks))
	if err := w.Flush(); err != nil {
		return err
	}
	if len(builds) > 1 {
		_, err := fmt.Fprintln(out, "note: these are not all one build (version and commit differ)")
		return err
	}
	return nil
}

// featureSummary is ": features ok" or the missing ones, after the
// kernel release; "" when the features were not checked.
func featureSummary(checks []datapath.CheckResult) string {
	if len(checks) == 0 {
		return ""
	}
	var missing []string
	for _, c := range checks {
		if !c.OK {
			missing = append(missing, c.Name)
		}
	}
	if len(missing) == 0 {
		names := make([]string, len(checks))
		for i, c := range checks {
			names[i] = c.Name
		}
		return "; has " + strings.Join(names, ", ")
	}
	return "; MISSING " + strings.Join(missing, ", ") + " (weir preflight says what breaks)"
}

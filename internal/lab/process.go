package lab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Proc is a long-running process the lab started. The lab stops it by its
// recorded PID, and only while /proc/PID/comm still names the same program,
// so a reused PID is never signalled.
type Proc struct {
	Name string `json:"name"` // what it is, such as "n1/kubelet"
	Comm string `json:"comm"` // the kernel's name for it (15 bytes at most)
	PID  int    `json:"pid"`
	Log  string `json:"log"`
	// NetNS and Argv start it again after a deliberate stop.
	NetNS string   `json:"netns,omitempty"`
	Argv  []string `json:"argv"`
}

// startProc runs argv inside the network namespace netns (the root
// namespace when netns is empty), its output appended to logPath. nsenter
// enters only the network namespace, unlike `ip netns exec`, which also
// remounts /sys and would hide cgroups and bpffs; it then execs argv, so
// the PID recorded is the program's own. The process gets its own session
// and outlives the lab command that started it.
func startProc(name, netns, logPath string, argv, env []string) (Proc, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return Proc{}, err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return Proc{}, err
	}
	defer logf.Close()
	cmdArgv := argv
	if netns != "" {
		cmdArgv = append([]string{"nsenter", "--net=" + nsPath(netns), "--"}, argv...)
	}
	cmd := exec.Command(cmdArgv[0], cmdArgv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return Proc{}, fmt.Errorf("start %s: %w", name, err)
	}
	// Reap the child if it exits while we are still around.
	go cmd.Wait()
	comm := filepath.Base(argv[0])
	if len(comm) > 15 {
		comm = comm[:15]
	}
	return Proc{Name: name, Comm: comm, PID: cmd.Process.Pid, Log: logPath, NetNS: netns, Argv: argv}, nil
}

// Alive reports whether the process still runs.
func (p Proc) Alive() bool { return processAlive(p.PID) && commIs(p.PID, p.Comm) }

// stop ends the process: SIGTERM, then SIGKILL after grace.
func (p Proc) stop(grace time.Duration) error { return stopProcess(p.PID, p.Comm, grace) }

// commIs reports whether pid runs the program comm. nsenter execs the
// program, so for a moment after start the comm is still "nsenter".
func commIs(pid int, comm string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return false
	}
	got := strings.TrimSpace(string(b))
	return got == comm || got == "nsenter"
}

// stopProcess sends SIGTERM, then SIGKILL after grace, and waits for exit.
// Only the given PID is signalled, and only if it still runs comm.
func stopProcess(pid int, comm string, grace time.Duration) error {
	if pid <= 0 || !processAlive(pid) || !commIs(pid, comm) {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop %s (pid %d): %w", comm, pid, err)
	}
	deadline := time.Now().Add(grace)
	for processAlive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			deadline = time.Now().Add(grace)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// Field 3 is the state; a zombie has exited.
	for i := len(b) - 1; i > 0; i-- {
		if b[i] == ')' {
			return i+2 < len(b) && b[i+2] != 'Z'
		}
	}
	return true
}

// procsMatching lists the PIDs whose command line (argv) match says yes
// to: how the lab finds processes it did not start itself (shims, agents
// in pods) by what they serve, never by a name alone.
func procsMatching(match func(argv []string) bool) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(cmd) == 0 {
			continue
		}
		if match(strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00")) {
			out = append(out, pid)
		}
	}
	return out
}

// Command cnitimer measures CNI calls for the pod-launch benchmark. It is
// installed under the name of every plugin in a directory the lab's
// runtimes search; invoked as PLUGIN, it runs the real PLUGIN (found in the
// directories listed in real-dirs beside it) with the same stdin and
// environment, and appends one JSON line to timing.jsonl beside it: which
// plugin, which command, which pod, and how long the real plugin took. Its
// own start-up is outside the measured span and the same for every plugin.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// record is one line of timing.jsonl.
type record struct {
	Plugin    string  `json:"plugin"`
	Command   string  `json:"command"`
	Container string  `json:"container"`
	Pod       string  `json:"pod"`
	StartUnix float64 `json:"start_unix"`
	Ms        float64 `json:"ms"`
	OK        bool    `json:"ok"`
}

func main() {
	self, err := os.Executable()
	if err != nil {
		fail(err)
	}
	dir, name := filepath.Dir(self), filepath.Base(os.Args[0])
	real, err := findReal(dir, name)
	if err != nil {
		fail(err)
	}
	cmd := exec.Command(real, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	start := time.Now()
	runErr := cmd.Run()
	took := time.Since(start)
	rec := record{
		Plugin: name, Command: os.Getenv("CNI_COMMAND"), Container: os.Getenv("CNI_CONTAINERID"),
		Pod: cniArg("K8S_POD_NAME"), StartUnix: float64(start.UnixNano()) / 1e9,
		Ms: float64(took) / float64(time.Millisecond), OK: runErr == nil,
	}
	if f, err := os.OpenFile(filepath.Join(dir, "timing.jsonl"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		b, _ := json.Marshal(rec)
		f.Write(append(b, '\n')) // one write: lines of concurrent calls never interleave
		f.Close()
	}
	if exit, ok := runErr.(*exec.ExitError); ok {
		os.Exit(exit.Sys().(syscall.WaitStatus).ExitStatus())
	}
	if runErr != nil {
		fail(runErr)
	}
}

// findReal looks the plugin up in the directories real-dirs lists.
func findReal(dir, name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "real-dirs"))
	if err != nil {
		return "", fmt.Errorf("cnitimer: %w", err)
	}
	for _, d := range strings.Fields(string(b)) {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("cnitimer: no plugin %s in %s", name, strings.Join(strings.Fields(string(b)), ", "))
}

// cniArg reads one key of CNI_ARGS (KEY=VALUE;KEY=VALUE).
func cniArg(key string) string {
	for _, kv := range strings.Split(os.Getenv("CNI_ARGS"), ";") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

func fail(err error) {
	fmt.Printf(`{"cniVersion":"1.0.0","code":999,"msg":%q}`, err.Error())
	os.Exit(1)
}

// Command weir-pause is the sandbox container the lab's pods start first:
// it holds the pod's namespaces, reaps the orphans that end up as its
// children (it is PID 1 of the pod) and exits on SIGINT or SIGTERM. It is
// the lab's stand-in for Kubernetes' pause image, built from this tree
// because the lab has no registry to pull from.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child without blocking.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// nginxServer is one nginx process (Debian's package), one worker, its
// configuration and temporary files in a directory of its own.
type nginxServer struct {
	srv *server
	dir string
}

// startNginx runs nginx in the server namespace, in cgroup cg, pinned to
// the server's CPU, one worker, answering "ok" on each port at addr
// (HTTP/1.1) and on each of h2Ports (HTTP/2 over cleartext, with prior
// knowledge, as gRPC speaks it), and waits until every port answers.
func startNginx(ctx context.Context, ns, cg, addr string, ports, h2Ports []int) (*nginxServer, error) {
	var servers strings.Builder
	var probes []string
	for _, set := range []struct {
		ports []int
		opts  string
	}{{ports, ""}, {h2Ports, " http2"}} {
		if len(set.ports) == 0 {
			continue
		}
		servers.WriteString("  server {\n")
		for _, p := range set.ports {
			fmt.Fprintf(&servers, "    listen %s:%d%s reuseport backlog=4096;\n", addr, p, set.opts)
			probes = append(probes, fmt.Sprintf("%s:%d", addr, p))
		}
		servers.WriteString("    location / { return 200 \"ok\\n\"; }\n  }\n")
	}
	return runNginx(ctx, ns, cg, serverCPU, servers.String(), probes)
}

// runNginx runs nginx in namespace ns pinned to cpu, in cgroup cg when it
// is set, with servers (the http block's server blocks and whatever they
// need beside them), and waits until every probe address accepts
// connections. Keep-alive connections live for the whole run.
func runNginx(ctx context.Context, ns, cg, cpu, servers string, probes []string) (_ *nginxServer, retErr error) {
	dir, err := os.MkdirTemp("", "weir-nginx-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(dir)
		}
	}()
	conf := fmt.Sprintf(`daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 100000000;
  keepalive_timeout 300s;
  http2_max_concurrent_streams 128;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
%[2]s}
`, dir, servers)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o644); err != nil {
		return nil, err
	}
	cmd := inNS(ctx, ns, cpu, "nginx", "-c", filepath.Join(dir, "nginx.conf"), "-p", dir, "-e", filepath.Join(dir, "error.log"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if cg != "" {
		fd, err := unix.Open(cg, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		defer unix.Close(fd)
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start nginx (apt-get install nginx): %w", err)
	}
	n := &nginxServer{srv: &server{cmd: cmd}, dir: dir}
	for _, addr := range probes {
		deadline := time.Now().Add(5 * time.Second)
		for !reachable(ctx, ns, addr, time.Second) {
			if time.Now().After(deadline) {
				log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
				n.srv.stop()
				return nil, fmt.Errorf("nginx does not answer at %s after 5 s: %s", addr, log)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return n, nil
}

func (n *nginxServer) stop() {
	n.srv.stop()
	os.RemoveAll(n.dir)
}

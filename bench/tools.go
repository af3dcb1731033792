package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPUs the load tools are pinned to, the same for every setup. Streams put
// the client on one CPU and the server on the other. Request/response puts
// both on one CPU: on this virtual machine waking a task on the other CPU
// costs 70-180 µs of inter-processor interrupt, against about 10 µs for
// the whole exchange on one CPU, and that noise would bury the datapath.
const (
	clientCPU = "0"
	serverCPU = "1"
	rrCPU     = "0"
)

// inNS returns a command that runs inside the network namespace at path,
// pinned to cpu.
func inNS(ctx context.Context, path, cpu string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + path, "--", "taskset", "-c", cpu}, args...)...)
}

// server is a background load-tool server, stopped by PID.
type server struct{ cmd *exec.Cmd }

func startServer(ctx context.Context, ns, cpu string, args ...string) (*server, error) {
	cmd := inNS(ctx, ns, cpu, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", args[0], err)
	}
	time.Sleep(150 * time.Millisecond) // let it bind
	return &server{cmd: cmd}, nil
}

func (s *server) stop() {
	if s.cmd.Process != nil {
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
		s.cmd.Wait()
	}
}

// nextPort gives every server run a fresh port, so a socket of the
// previous run lingering in TIME_WAIT never stops the next one binding.
var portCounter = 20000

func nextPort() string {
	portCounter++
	return fmt.Sprint(portCounter)
}

// retryRefused reruns a client while the server it talks to is not yet
// listening (a refused connection), for up to five seconds.
func retryRefused(run func() ([]byte, error)) ([]byte, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, err := run()
		refused := bytes.Contains(out, []byte("Connection refused")) || bytes.Contains(out, []byte("unable to connect"))
		if !refused || time.Now().After(deadline) {
			return out, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// iperfResult is the part of iperf3's JSON the benchmark reads.
type iperfResult struct {
	End struct {
		SumReceived struct {
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum_received"`
		Sum struct {
			BitsPerSecond float64 `json:"bits_per_second"`
			LostPercent   float64 `json:"lost_percent"`
		} `json:"sum"`
	} `json:"end"`
	Error string `json:"error"`
}

// tcpStream measures bulk TCP throughput in Gbit/s.
func tcpStream(ctx context.Context, clientNS, serverNS, dst string, d time.Duration) (float64, error) {
	r, err := iperf(ctx, clientNS, serverNS, dst, d)
	if err != nil {
		return 0, err
	}
	return r.End.SumReceived.BitsPerSecond / 1e9, nil
}

// udpStream measures UDP goodput in Gbit/s (1,300-byte datagrams, sent
// as fast as the sender can) and the loss the receiver saw.
func udpStream(ctx context.Context, clientNS, serverNS, dst string, d time.Duration) (gbps, loss float64, err error) {
	r, err := iperf(ctx, clientNS, serverNS, dst, d, "-u", "-b", "0", "-l", "1300")
	if err != nil {
		return 0, 0, err
	}
	gbps = r.End.Sum.BitsPerSecond * (1 - r.End.Sum.LostPercent/100) / 1e9
	return gbps, r.End.Sum.LostPercent, nil
}

func iperf(ctx context.Context, clientNS, serverNS, dst string, d time.Duration, extra ...string) (*iperfResult, error) {
	port := nextPort()
	srv, err := startServer(ctx, serverNS, serverCPU, "iperf3", "-s", "-1", "-p", port)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	args := append([]string{"iperf3", "-c", dst, "-p", port, "-t", fmt.Sprint(int(d.Seconds())), "-J"}, extra...)
	out, err := retryRefused(func() ([]byte, error) { return inNS(ctx, clientNS, clientCPU, args...).Output() })
	var r iperfResult
	if jerr := json.Unmarshal(out, &r); jerr != nil {
		return nil, fmt.Errorf("iperf3 %v: %v (%w)", args, jerr, err)
	}
	if r.Error != "" {
		return nil, fmt.Errorf("iperf3: %s", r.Error)
	}
	return &r, nil
}

// rrResult is a request/response latency run.
type rrResult struct {
	AvgUs, P50Us, P99Us float64
}

var (
	avgRe = regexp.MustCompile(`avg-latency=([0-9.]+)`)
	pctRe = regexp.MustCompile(`percentile ([0-9.]+) =\s+([0-9.]+)`)
)

// tcpRR measures TCP request/response latency with sockperf ping-pong: one
// 64-byte message in flight at a time over one connection. sockperf
// reports half the round trip in microseconds; so do we.
func tcpRR(ctx context.Context, clientNS, serverNS, dst string, d time.Duration) (rrResult, error) {
	port := nextPort()
	srv, err := startServer(ctx, serverNS, rrCPU, "sockperf", "server", "--tcp", "-i", "0.0.0.0", "-p", port)
	if err != nil {
		return rrResult{}, err
	}
	defer srv.stop()
	return sockperfPingPong(ctx, clientNS, dst, port, d)
}

func parseSockperf(out []byte) (rrResult, error) {
	var r rrResult
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if m := avgRe.FindStringSubmatch(line); m != nil {
			r.AvgUs, _ = strconv.ParseFloat(m[1], 64)
		}
		if m := pctRe.FindStringSubmatch(line); m != nil {
			v, _ := strconv.ParseFloat(m[2], 64)
			switch strings.TrimRight(strings.TrimRight(m[1], "0"), ".") {
			case "50":
				r.P50Us = v
			case "99":
				r.P99Us = v
			}
		}
	}
	if r.AvgUs == 0 {
		return r, fmt.Errorf("no latency in sockperf output: %s", out)
	}
	return r, nil
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/spf13/cobra"
	"golang.org/x/net/dns/dnsmessage"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// webFQDN is the benchmark Service's name as a pod looks it up.
const webFQDN = "web." + svNamespace + ".svc.cluster.local."

// measure runs one repetition of every test against one Service proxy
// at one Service count, and what the proxy cost meanwhile.
func (b *svBench) measure(ctx context.Context, p serviceProxy, level, rep int) error {
	setup := fmt.Sprintf("%s, %d Services", p.Name, level)
	agents, proxies, err := b.proxyPIDs(p.KubeProxy)
	if err != nil {
		return err
	}
	agentsBefore, err := readUsage(agents)
	if err != nil {
		return err
	}
	proxiesBefore, err := readUsage(proxies)
	if err != nil {
		return err
	}
	d := b.o.duration
	for _, path := range []string{"intra", "inter"} {
		client := b.clients[path].NetNS
		for _, to := range []struct {
			suffix, host   string
			httpAt, rrPort int
		}{
			{"", b.web.String(), 80, 81},
			{" pod IP", b.server.IP.String(), svHTTPPort, svRRPort},
		} {
			w, err := connRate(ctx, client, "http://"+net.JoinHostPort(to.host, strconv.Itoa(to.httpAt))+"/", d)
			if err != nil {
				return fmt.Errorf("new connections %s%s: %w", path, to.suffix, err)
			}
			b.add(setup, path+to.suffix, "crr_per_s", rep, w.rps)
			b.add(setup, path+to.suffix, "crr_errors", rep, float64(w.errors))
			if to.suffix == "" {
				c, err := connLatency(ctx, client, net.JoinHostPort(to.host, strconv.Itoa(to.httpAt)), d)
				if err != nil {
					return fmt.Errorf("connection latency %s: %w", path, err)
				}
				b.add(setup, path, "conn_p50_ms", rep, c.P50Ms)
				b.add(setup, path, "conn_p99_ms", rep, c.P99Ms)
				b.add(setup, path, "conn_failed", rep, float64(c.Failed))
			}
			r, err := sockperfPingPong(ctx, client, to.host, strconv.Itoa(to.rrPort), d)
			if err != nil {
				return fmt.Errorf("request/response %s%s: %w", path, to.suffix, err)
			}
			b.add(setup, path+to.suffix, "rr_avg_us", rep, r.AvgUs)
			b.add(setup, path+to.suffix, "rr_p99_us", rep, r.P99Us)
		}
	}
	w, err := connRate(ctx, nsFile(b.st.ExtHost), "http://"+b.nodePortAddr()+"/", d)
	if err != nil {
		return fmt.Errorf("NodePort from outside: %w", err)
	}
	b.add(setup, "nodeport", "crr_per_s", rep, w.rps)
	b.add(setup, "nodeport", "crr_errors", rep, float64(w.errors))
	c, err := connLatency(ctx, nsFile(b.st.ExtHost), b.nodePortAddr(), d)
	if err != nil {
		return fmt.Errorf("NodePort connection latency: %w", err)
	}
	b.add(setup, "nodeport", "conn_p50_ms", rep, c.P50Ms)
	b.add(setup, "nodeport", "conn_p99_ms", rep, c.P99Ms)
	b.add(setup, "nodeport", "conn_failed", rep, float64(c.Failed))
	dr, err := dnsLoad(ctx, b.clients["inter"].NetNS, netip.AddrPortFrom(b.dns, 53), d)
	if err != nil {
		return fmt.Errorf("DNS: %w", err)
	}
	b.add(setup, "dns", "dns_per_s", rep, dr.PerS)
	b.add(setup, "dns", "dns_p50_ms", rep, dr.P50Ms)
	b.add(setup, "dns", "dns_p99_ms", rep, dr.P99Ms)
	b.add(setup, "dns", "dns_failed", rep, float64(dr.Failed))
	for range b.o.samples {
		took, err := b.timeChange(ctx)
		if err != nil {
			return err
		}
		b.add(setup, "change", "change_ms", rep, ms(took))
	}
	agentsAfter, err := readUsage(agents)
	if err != nil {
		return err
	}
	proxiesAfter, err := readUsage(proxies)
	if err != nil {
		return err
	}
	b.add(setup, "cost", "agent_cpu_pct", rep, agentsAfter.agentPct(agentsBefore))
	b.add(setup, "cost", "agent_rss_mib", rep, agentsAfter.rssMiB)
	if p.KubeProxy {
		b.add(setup, "cost", "kube_proxy_cpu_pct", rep, proxiesAfter.agentPct(proxiesBefore))
		b.add(setup, "cost", "kube_proxy_rss_mib", rep, proxiesAfter.rssMiB)
	}
	fmt.Fprintf(b.out, "    rep %d, %s: intra %.0f conn/s, nodeport %.0f conn/s, DNS p99 %.2f ms\n", rep+1, setup,
		b.last(setup, "intra", "crr_per_s"), w.rps, dr.P99Ms)
	return nil
}

func (b *svBench) add(setup, path, metric string, rep int, v float64) {
	b.res.Samples = append(b.res.Samples, sample{Setup: setup, Path: path, Metric: metric, Rep: rep, Value: v})
}

// last is the newest sample of a setup, path and metric.
func (b *svBench) last(setup, path, metric string) float64 {
	for i := len(b.res.Samples) - 1; i >= 0; i-- {
		if s := b.res.Samples[i]; s.Setup == setup && s.Path == path && s.Metric == metric {
			return s.Value
		}
	}
	return 0
}

// timeChange creates a new Service for the server and times it from the
// create call to the first connection through its ClusterIP from the
// other node's client: the API server, the EndpointSlice controller and
// the Service proxy's programming together, as a user waits for them.
// The Service is deleted afterwards (not timed).
func (b *svBench) timeChange(ctx context.Context) (time.Duration, error) {
	b.changes++
	api := b.c.CoreV1().Services(svNamespace)
	name := fmt.Sprintf("change-%d", b.changes)
	start := time.Now()
	svc, err := api.Create(ctx, webService(name, 0), metav1.CreateOptions{})
	if err != nil {
		return 0, fmt.Errorf("create Service %s: %w", name, err)
	}
	defer api.Delete(context.Background(), name, metav1.DeleteOptions{})
	conn, at, err := firstReachable(ctx, b.clients["inter"].NetNS, net.JoinHostPort(svc.Spec.ClusterIP, "80"), 5*time.Millisecond, time.Minute)
	if err != nil {
		return 0, fmt.Errorf("Service %s: %w", name, err)
	}
	conn.Close()
	return at.Sub(start), nil
}

// connRateResult is what one wrk run with a connection per request gave.
type connRateResult struct {
	rps    float64
	errors int // wrk's socket errors and failed answers
}

// connRate runs wrk from the namespace at nsPath (pinned to the client
// CPU) against url with "Connection: close": every request a new
// connection, four at a time, the load where a Service proxy's
// per-connection work shows. (wrk's latencies start at the request's
// write, after the handshake: connLatency times whole connections.)
func connRate(ctx context.Context, nsPath, url string, d time.Duration) (connRateResult, error) {
	args := []string{"wrk", "-t1", "-c4", "-d", fmt.Sprintf("%ds", int(d.Seconds())), "-H", "Connection: close", url}
	// wrk waits for ever on a connection whose handshake never completes.
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	out, err := inNS(ctx, nsPath, clientCPU, args...).CombinedOutput()
	if err != nil {
		return connRateResult{}, fmt.Errorf("wrk: %w: %s", err, out)
	}
	w, _ := parseWrk(out)
	if w.requests == 0 {
		return connRateResult{}, fmt.Errorf("wrk made no request: %s", out)
	}
	r := connRateResult{rps: w.rps}
	// Socket errors (a reset connection, a timeout) are the proxy's too:
	// counted, and the rate is what got through.
	if m := wrkErrors.FindSubmatch(out); m != nil {
		for _, e := range m[1:] {
			n, _ := strconv.Atoi(string(e))
			r.errors += n
		}
	}
	if m := wrkNon2xx.FindSubmatch(out); m != nil {
		n, _ := strconv.Atoi(string(m[1]))
		r.errors += n
	}
	return r, nil
}

// latencyResult summarises one run of one-at-a-time exchanges.
type latencyResult struct {
	N      int     `json:"n"`
	Failed int     `json:"failed"` // exchanges that failed (not timed)
	PerS   float64 `json:"per_s"`
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
}

// connLatency runs the conn-client subcommand from the namespace at
// nsPath, pinned to the client CPU: whole connections (handshake, one
// request, its answer, close) one after another, each timed.
func connLatency(ctx context.Context, nsPath, addr string, d time.Duration) (latencyResult, error) {
	return runLatencyClient(ctx, nsPath, d, "conn-client", "--addr", addr, "--duration", d.String())
}

// runLatencyClient runs one of the bench binary's timing clients in a
// namespace and reads its JSON summary.
func runLatencyClient(ctx context.Context, nsPath string, d time.Duration, args ...string) (latencyResult, error) {
	var r latencyResult
	return r, runJSONClient(ctx, nsPath, d, &r, args...)
}

// runJSONClient runs the bench binary's subcommand args in the namespace
// at nsPath, pinned to the client CPU, for about d, and decodes the JSON
// it prints into out.
func runJSONClient(ctx context.Context, nsPath string, d time.Duration, out any, args ...string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	cmd := inNS(ctx, nsPath, clientCPU, append([]string{self}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", args[0], err, stderr.String())
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s output %q: %w", args[0], b, err)
	}
	return nil
}

// timeLoop runs one exchange after another for d and summarises their
// durations. A failed exchange is counted, not timed; a run where none
// succeeded fails with the last error.
func timeLoop(d time.Duration, exchange func() error) (latencyResult, error) {
	var lat []float64
	var failed int
	var last error
	start := time.Now()
	for time.Since(start) < d {
		t0 := time.Now()
		if err := exchange(); err != nil {
			failed, last = failed+1, err
			continue
		}
		lat = append(lat, ms(time.Since(t0)))
	}
	if len(lat) == 0 {
		return latencyResult{}, fmt.Errorf("all %d failed, the last: %w", failed, last)
	}
	sort.Float64s(lat)
	return latencyResult{N: len(lat), Failed: failed, PerS: float64(len(lat)) / time.Since(start).Seconds(),
		P50Ms: quantile(lat, 0.5), P99Ms: quantile(lat, 0.99)}, nil
}

// newConnClientCommand times whole HTTP/1.0 connections to addr, one
// after another, and prints the rate and latency quantiles as JSON. A
// connection that does not complete within five seconds is counted as
// failed.
func newConnClientCommand() *cobra.Command {
	var addr string
	var d time.Duration
	cmd := &cobra.Command{
		Use:    "conn-client",
		Short:  "Time whole connections, one at a time (the services scenario's connection latency)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			buf := make([]byte, len(httpAnswer))
			r, err := timeLoop(d, func() error {
				c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
				if err != nil {
					return err
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.WriteString(c, "GET / HTTP/1.0\r\n\r\n"); err != nil {
					return err
				}
				// The whole answer, then this side closes first (as
				// wrk does): the server keeps no TIME_WAIT.
				got := 0
				for got < len(httpAnswer) {
					n, err := c.Read(buf[got:])
					if err != nil {
						return fmt.Errorf("%s: %w after %d bytes", addr, err, got)
					}
					got += n
				}
				return nil
			})
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(r)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "", "HTTP server address:port")
	cmd.Flags().DurationVar(&d, "duration", 3*time.Second, "how long to keep connecting")
	return cmd
}

// dnsLoad runs the dns-client subcommand from the namespace at nsPath,
// pinned to the client CPU.
func dnsLoad(ctx context.Context, nsPath string, server netip.AddrPort, d time.Duration) (latencyResult, error) {
	return runLatencyClient(ctx, nsPath, d, "dns-client", "--server", server.String(), "--name", webFQDN, "--duration", d.String())
}

// newDNSClientCommand looks name up at server one query after another
// for a while, each from a new connected UDP socket as a resolver library
// does, and prints the rate and latency quantiles as JSON. A query
// without an answer within a second fails the run.
func newDNSClientCommand() *cobra.Command {
	var server, name string
	var d time.Duration
	cmd := &cobra.Command{
		Use:    "dns-client",
		Short:  "Time DNS lookups, one at a time (the services scenario's DNS test)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ap, err := netip.ParseAddrPort(server)
			if err != nil {
				return fmt.Errorf("--server %q: want address:port: %w", server, err)
			}
			r, err := timeLoop(d, func() error {
				_, err := lookupA(cmd.Context(), ap, name)
				return err
			})
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(r)
		},
	}
	cmd.Flags().StringVar(&server, "server", "", "DNS server address:port")
	cmd.Flags().StringVar(&name, "name", "", "fully qualified name to look up (A record)")
	cmd.Flags().DurationVar(&d, "duration", 4*time.Second, "how long to keep looking up")
	return cmd
}

// dnsLookupOnce makes one lookup from inside the namespace at nsPath.
func dnsLookupOnce(ctx context.Context, nsPath string, server netip.AddrPort, name string) (time.Duration, error) {
	var took time.Duration
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) (err error) {
		took, err = lookupA(ctx, server, name)
		return err
	})
	return took, err
}

// lookupA asks server for name's A records over a new UDP socket and
// wants at least one in a successful answer to its own query.
func lookupA(ctx context.Context, server netip.AddrPort, name string) (time.Duration, error) {
	q, err := dnsmessage.NewName(name)
	if err != nil {
		return 0, fmt.Errorf("name %q: %w", name, err)
	}
	id := uint16(rand.Uint32())
	msg := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: id, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: q, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}},
	}
	query, err := msg.Pack()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp4", server.String())
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(start.Add(time.Second))
	if _, err := c.Write(query); err != nil {
		return 0, fmt.Errorf("send query: %w", err)
	}
	buf := make([]byte, 1500)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return 0, fmt.Errorf("%s from %v: %w", name, server, err)
		}
		var ans dnsmessage.Message
		if err := ans.Unpack(buf[:n]); err != nil || ans.Header.ID != id || !ans.Header.Response {
			continue // not the answer to this query
		}
		took := time.Since(start)
		if ans.Header.RCode != dnsmessage.RCodeSuccess || len(ans.Answers) == 0 {
			return 0, fmt.Errorf("%s from %v: %v with %d answers", name, server, ans.Header.RCode, len(ans.Answers))
		}
		return took, nil
	}
}

// sockperfPingPong runs sockperf's client against a server already
// listening at host:port, both on the request/response CPU.
func sockperfPingPong(ctx context.Context, nsPath, host, port string, d time.Duration) (rrResult, error) {
	args := []string{"sockperf", "ping-pong", "--tcp", "-i", host, "-p", port, "-t", fmt.Sprint(int(d.Seconds())), "-m", "64"}
	out, err := retryRefused(func() ([]byte, error) { return inNS(ctx, nsPath, rrCPU, args...).CombinedOutput() })
	if err != nil {
		return rrResult{}, fmt.Errorf("sockperf: %w: %s", err, out)
	}
	return parseSockperf(out)
}

package agent

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weirnet/weir/internal/datapath"
)

// scrape reads addr's /metrics into series -> value, a series written as
// the exposition format writes it: name{label="value",...}, labels sorted.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + PathMetrics)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s\n%s", PathMetrics, resp.Status, b)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// TestMetricsAfterTraffic: real packets through a policy show up in the
// metrics the agent serves on --metrics-addr, and the map counts agree
// with what the agent wrote; with flow events off
// (--flow-events=false) the verdict, drop and Log metrics count the same.
func TestMetricsAfterTraffic(t *testing.T) {
	t.Run("flow events on", func(t *testing.T) { metricsAfterTraffic(t, true) })
	t.Run("flow events off", func(t *testing.T) { metricsAfterTraffic(t, false) })
}

func metricsAfterTraffic(t *testing.T, flowEvents bool) {
	n := newTestNode(t, "10.244.9.0/24")
	client, server := n.newPod(), n.newPod()
	sr := n.clientAndServer(client, server, nil, auditAndReject())
	if err := n.dp.SetFlowEvents(flowEvents); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := n.agent.readFlows(ctx, n.dp); err != nil {
		t.Fatal(err)
	}
	n.agent.cfg.MetricsAddr = freeLoopbackAddr(t)
	ln, err := n.agent.Listen()
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- n.agent.ServeOn(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	awaitAccepting(t, n.agent.cfg.MetricsAddr)

	srv := sr.Address.Addr().String()
	var open, rejected net.Listener
	in(t, server, func() (err error) {
		if open, err = net.Listen("tcp4", ":8080"); err != nil {
			return err
		}
		rejected, err = net.Listen("tcp4", ":8081")
		return err
	})
	defer open.Close()
	defer rejected.Close()
	go serveTCP(open)
	go serveTCP(rejected)
	in(t, client, func() error {
		for range 3 {
			if c, err := net.DialTimeout("tcp4", srv+":8080", 3*time.Second); err != nil {
				t.Errorf("allowed connect: %v", err)
			} else {
				c.Close()
			}
			if _, err := net.DialTimeout("tcp4", srv+":8081", 3*time.Second); err == nil {
				t.Error("rejected connect succeeded")
			}
		}
		return nil
	})

	const (
		rejects = `weir_policy_drops_total{action="Reject",kind="WeirClusterNetworkPolicy",namespace="",policy="audit-and-reject"}`
		allowed = `weir_policy_verdicts_total{direction="ingress",stage="admin",verdict="allowed"}`
		logged  = `weir_policy_logged_total{kind="WeirClusterNetworkPolicy",policy="audit-and-reject"}`
	)
	var m map[string]float64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if m = scrape(t, n.agent.cfg.MetricsAddr); m[rejects] >= 3 && m[logged] >= 6 {
			break
		}
	}
	if m[rejects] < 3 || m[logged] < 6 {
		t.Fatalf("%s = %v, %s = %v after 3 rejected and 3 allowed connects", rejects, m[rejects], logged, m[logged])
	}
	if m[`weir_datapath_packets_total{outcome="policy_reject"}`] < 3 {
		t.Errorf("policy_reject packets %v, want 3 or more", m[`weir_datapath_packets_total{outcome="policy_reject"}`])
	}
	// The Admin tier Log rule decides nothing: allowed connections pass
	// to the default stage.
	if m[allowed]+m[`weir_policy_verdicts_total{direction="ingress",stage="default",verdict="allowed"}`] < 3 {
		t.Errorf("no allowed verdicts: %v", m)
	}
	if m["weir_policy_reconcile_seconds_count"] < 1 || m["weir_policy_reconcile_errors_total"] != 0 {
		t.Errorf("reconciles %v with %v errors, want some and none", m["weir_policy_reconcile_seconds_count"], m["weir_policy_reconcile_errors_total"])
	}
	if m[`weir_map_capacity{map="conntrack"}`] != 131072 || m[`weir_map_capacity{map="policy"}`] != 1<<20 {
		t.Errorf("capacities: conntrack %v, policy %v", m[`weir_map_capacity{map="conntrack"}`], m[`weir_map_capacity{map="policy"}`])
	}

	// The counts of the real maps: conntrack holds the connections, the
	// policy map what the agent says it wrote.
	ct, err := n.dp.MapEntries(datapath.MapConntrack, 0)
	if err != nil || ct < 3 {
		t.Errorf("conntrack entries %d (%v), want the connections made", ct, err)
	}
	counted, err := n.dp.MapEntries(datapath.MapPolicy, 0)
	if known := n.agent.metrics.maps.policyEntries.Load(); err != nil || known <= 0 || int64(counted) != known {
		t.Errorf("policy map holds %d entries (%v); the agent counts %d", counted, err, known)
	}
	if eps, err := n.dp.MapEntries(datapath.MapEndpointPolicy, 0); err != nil || eps != 2 {
		t.Errorf("endpoint policy entries %d (%v), want 2", eps, err)
	}
	if got, err := n.dp.MapEntries(datapath.MapConntrack, 1); err != nil || got < 1 {
		t.Errorf("conntrack count limited to 1: %d (%v)", got, err)
	}
	n.agent.metrics.maps.current(0)
	m = scrape(t, n.agent.cfg.MetricsAddr)
	if got := m[`weir_map_entries{map="conntrack"}`]; got < 3 {
		t.Errorf("weir_map_entries{map=conntrack} %v after a recount, want %d", got, ct)
	}
}

// A taken metrics port is a start-up error naming the flag, and the
// listeners opened before it are closed.
func TestMetricsAddrInUse(t *testing.T) {
	n := newTestNode(t, "10.244.10.0/24")
	n.agent.cfg.HealthAddr = freeLoopbackAddr(t)
	serveOnTakenPort(t, n, &n.agent.cfg.MetricsAddr, "--metrics-addr")
	if c, err := net.DialTimeout("tcp", n.agent.cfg.HealthAddr, time.Second); err == nil {
		c.Close()
		t.Fatal("the health listener still accepts after a failed start")
	}
}

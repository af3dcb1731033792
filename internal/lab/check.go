package lab

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// endpoint is a row or column of the matrix.
type endpoint struct {
	Label string
	NS    string     // namespace path
	IP    netip.Addr // address probes are sent to
	Node  string     // node it lives on ("" for the outside host)
	Kind  string     // pod, node, ext
}

// Cell is the outcome of probing one pair with every protocol.
type Cell struct {
	From, To string
	Results  map[Proto]ProbeResult
	Want     netip.Addr // source address the server should see
	Failed   []string
}

// Matrix is the whole connectivity check.
type Matrix struct {
	Rows, Cols []string
	Cells      map[[2]string]*Cell
	Probes     int
	Failures   int
}

// Err summarises the failures, nil when every probe passed.
func (m *Matrix) Err() error {
	if m.Failures == 0 {
		return nil
	}
	var lines []string
	for _, r := range m.Rows {
		for _, c := range m.Cols {
			if cell := m.Cells[[2]string{r, c}]; cell != nil && len(cell.Failed) > 0 {
				lines = append(lines, fmt.Sprintf("%s -> %s: %s", r, c, strings.Join(cell.Failed, "; ")))
			}
		}
	}
	return fmt.Errorf("%d of %d probes failed:\n  %s", m.Failures, m.Probes, strings.Join(lines, "\n  "))
}

// Check probes TCP, UDP and ICMP between every pod, from every pod to
// every node and the outside host, and from every node to every pod. Each
// answer must come back and, for TCP and UDP, the server must have seen
// the right source: the pod itself inside the cluster, the node's address
// (masquerade) outside it.
func Check(ctx context.Context, st *State, timeout time.Duration) (*Matrix, error) {
	var pods, nodes []endpoint
	for _, p := range st.Pods {
		pods = append(pods, endpoint{Label: p.Name, NS: nsPath(p.NetNS), IP: p.IP, Node: p.Node, Kind: "pod"})
	}
	for _, n := range st.Nodes {
		nodes = append(nodes, endpoint{Label: n.Name, NS: nsPath(n.NetNS), IP: n.IP, Node: n.Name, Kind: "node"})
	}
	ext := endpoint{Label: "ext", NS: nsPath(st.ExtHost), IP: st.ExtIP, Kind: "ext"}

	targets := append(append(append([]endpoint{}, pods...), nodes...), ext)
	servers := make([]*echoServer, 0, len(targets))
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	for _, t := range targets {
		s, err := startEcho(t.NS)
		if err != nil {
			return nil, err
		}
		servers = append(servers, s)
	}

	m := &Matrix{Cells: map[[2]string]*Cell{}}
	for _, t := range targets {
		m.Cols = append(m.Cols, t.Label)
	}
	type job struct{ src, dst endpoint }
	var jobs []job
	for _, src := range append(append([]endpoint{}, pods...), nodes...) {
		m.Rows = append(m.Rows, src.Label)
		for _, dst := range targets {
			if src.Label == dst.Label || (src.Kind == "node" && dst.Kind != "pod") {
				continue
			}
			jobs = append(jobs, job{src, dst})
		}
	}

	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, j := range jobs {
		for _, proto := range Protos {
			wg.Add(1)
			sem <- struct{}{}
			go func(j job, proto Proto) {
				defer wg.Done()
				defer func() { <-sem }()
				r := Probe(ctx, j.src.NS, j.dst.IP, proto, timeout)
				mu.Lock()
				defer mu.Unlock()
				m.record(st, j.src, j.dst, proto, r)
			}(j, proto)
		}
	}
	wg.Wait()
	return m, nil
}

// record stores a result and judges it.
func (m *Matrix) record(st *State, src, dst endpoint, proto Proto, r ProbeResult) {
	key := [2]string{src.Label, dst.Label}
	cell := m.Cells[key]
	if cell == nil {
		cell = &Cell{From: src.Label, To: dst.Label, Results: map[Proto]ProbeResult{}, Want: wantSource(st, src, dst)}
		m.Cells[key] = cell
	}
	cell.Results[proto] = r
	m.Probes++
	switch {
	case !r.OK:
		cell.Failed = append(cell.Failed, fmt.Sprintf("%s: %v", proto, r.Err))
		m.Failures++
	case proto != ICMP && r.SeenAs != cell.Want:
		cell.Failed = append(cell.Failed, fmt.Sprintf("%s: server saw source %v, want %v", proto, r.SeenAs, cell.Want))
		m.Failures++
	}
}

// wantSource is the source address dst should see from src.
func wantSource(st *State, src, dst endpoint) netip.Addr {
	if src.Kind == "node" {
		return src.IP
	}
	// Pods and nodes are the cluster; only the outside host sees the node.
	if dst.Kind != "ext" {
		return src.IP
	}
	n, _ := st.NodeByName(src.Node)
	return n.IP // masqueraded
}

// Print writes the matrix: a cell shows T, U and I for each protocol that
// passed, '-' for one that failed, '!' for one answered from a wrong source.
func (m *Matrix) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprint(tw, "from\\to\t")
	for _, c := range m.Cols {
		fmt.Fprintf(tw, "%s\t", c)
	}
	fmt.Fprintln(tw)
	for _, r := range m.Rows {
		fmt.Fprintf(tw, "%s\t", r)
		for _, c := range m.Cols {
			cell := m.Cells[[2]string{r, c}]
			if cell == nil {
				fmt.Fprint(tw, "\t")
				continue
			}
			var b strings.Builder
			for _, p := range Protos {
				res := cell.Results[p]
				switch {
				case !res.OK:
					b.WriteByte('-')
				case p != ICMP && res.SeenAs != cell.Want:
					b.WriteByte('!')
				default:
					b.WriteByte(strings.ToUpper(string(p))[0])
				}
			}
			fmt.Fprintf(tw, "%s\t", b.String())
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	fmt.Fprintf(w, "%d/%d probes passed (T=TCP U=UDP I=ICMP; '-' failed, '!' wrong source address)\n", m.Probes-m.Failures, m.Probes)
}

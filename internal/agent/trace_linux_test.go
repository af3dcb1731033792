package agent

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/k8s"
)

// TestTraceExplainsAndConfirms: a trace of two local pods names the
// Reject and Log rules at the server's ingress, the datapath run agrees,
// pods resolve by name and by address, and a flow with no local end is
// refused naming the nodes.
func TestTraceExplainsAndConfirms(t *testing.T) {
	n := newTestNode(t, "10.244.1.0/24")
	client, server := n.newPod(), n.newPod()
	far := k8s.Pod{Namespace: "default", Name: "far", Labels: map[string]string{"app": "client"}, NodeName: "n2",
		IPs: []netip.Addr{netip.MustParseAddr("10.244.2.9")}}
	sr := n.clientAndServer(client, server, []k8s.Pod{far}, auditAndReject())

	tr, err := n.agent.Trace(api.TraceQuery{Src: "default/client", Dst: sr.Address.Addr().String(), Proto: "tcp", Port: 8081})
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Agree || tr.Verdict != "rejected" || tr.Program != "from_container" || len(tr.Ends) != 2 || tr.Dst.Pod != "default/server" {
		t.Fatalf("trace %+v, want a rejected flow both ends judged, agreeing", tr)
	}
	in := tr.Ends[1]
	if in.Direction != "ingress" || in.Compiled.Stage != "admin" || in.Compiled.RuleName == "" || in.Compiled.LogName == "" ||
		in.Datapath == nil || *in.Datapath != in.Compiled || len(in.Steps) == 0 || !in.Tiered {
		t.Fatalf("server ingress %+v, want rejected at admin by a named rule, logged, confirmed", in)
	}
	tr, err = n.agent.Trace(api.TraceQuery{Src: "default/client", Dst: "default/server", Proto: "tcp", Port: 8080})
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Agree || tr.Verdict != "allowed" || tr.TCVerdict == "shot" {
		t.Fatalf("trace %+v, want allowed and agreeing", tr)
	}
	// From a remote pod: only the server's ingress is judged, through the overlay.
	tr, err = n.agent.Trace(api.TraceQuery{Src: "default/far", Dst: "default/server", Proto: "udp", Port: 9000})
	if err != nil {
		t.Fatal(err)
	}
	if !tr.Agree || len(tr.Ends) != 1 || tr.Ends[0].Compiled.Verdict != "rejected" || tr.Src.Node != "n2" {
		t.Fatalf("trace %+v, want the server's ingress rejecting the remote pod", tr)
	}
	if _, err := n.agent.Trace(api.TraceQuery{Src: "default/far", Dst: "10.244.2.10", Proto: "icmp"}); !errors.Is(err, ErrNotLocal) {
		t.Fatalf("trace with no local end: %v, want ErrNotLocal", err)
	}
	if _, err := n.agent.Trace(api.TraceQuery{Src: "default/client", Dst: "default/server", Proto: "tcp"}); api.CodeOf(err) != api.CodeDecodeFailure {
		t.Fatalf("tcp without a port: %v, want a decode failure", err)
	}
}

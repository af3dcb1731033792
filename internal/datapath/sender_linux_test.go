package datapath

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	npav1alpha2 "sigs.k8s.io/network-policy-api/apis/v1alpha2"

	"github.com/weirnet/weir/internal/policy"
)

var (
	ownerNode = netip.MustParseAddr("10.99.0.12") // owns 10.244.2.0/24 in loadTest
	otherNode = netip.MustParseAddr("10.99.0.13") // a peer owning nothing here
	// newRemote is a pod of the owner's that the ipcache does not know yet.
	newRemote = netip.MustParseAddr("10.244.2.50")
)

// withPeers registers the test's peer nodes as SetPeers would.
func withPeers(t *testing.T, p *Programs) {
	t.Helper()
	for _, a := range []netip.Addr{ownerNode, otherNode} {
		if err := (peerNodeMap{p.PeerNodes}).put(a); err != nil {
			t.Fatal(err)
		}
	}
}

// runOverlay runs from_overlay on frame as if the VXLAN device had
// decapsulated it from sender with vni.
func runOverlay(t *testing.T, p *Programs, frame []byte, sender netip.Addr, vni uint32) uint32 {
	t.Helper()
	ctx := skbCtx{IngressIfindex: 99}
	if sender.IsValid() {
		a := sender.As4()
		ctx.Cb[0] = binary.NativeEndian.Uint32(a[:])
	}
	ctx.Cb[1] = vni
	ret, err := p.FromOverlay.Run(&ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: ctx})
	if err != nil {
		t.Fatalf("BPF_PROG_RUN: %v", err)
	}
	return ret
}

// TestFromOverlayChecksTheSender: only peer nodes may send into the
// overlay, a pod address only from the node that owns its CIDR, and this
// node's own pod addresses never. Each refusal is counted.
func TestFromOverlayChecksTheSender(t *testing.T) {
	p := loadTest(t, ModeVXLAN)
	withPeers(t, p)
	thisNode := netip.MustParseAddr("10.99.0.11")
	for a, id := range map[netip.Addr]uint32{thisNode: uint32(policy.IdentityHost),
		ownerNode: uint32(policy.IdentityRemoteNode), otherNode: uint32(policy.IdentityRemoteNode)} {
		k, _ := bpfAddr(a)
		if err := p.IPCache.Put(k, id); err != nil {
			t.Fatal(err)
		}
	}
	id := uint32(policy.MinClusterIdentity)
	cases := []struct {
		name   string
		src    netip.Addr
		sender netip.Addr
		want   uint32
	}{
		{"a peer's pod from its owner", remote, ownerNode, tcActRedirect},
		{"the owner node itself", ownerNode, ownerNode, tcActRedirect},
		{"a peer's pod from another peer", remote, otherNode, tcActShot},
		{"a peer's pod from a host that is no node", remote, outside, tcActShot},
		{"an outside address from a host that is no node", outside, outside, tcActShot},
		{"a local pod's address from the owner", podB, ownerNode, tcActShot},
		{"an unused address of this node's pod CIDR", netip.MustParseAddr("10.244.1.99"), ownerNode, tcActShot},
		{"a pod address no node owns", netip.MustParseAddr("10.244.50.1"), ownerNode, tcActShot},
		{"this node's own address", thisNode, ownerNode, tcActShot},
		{"another node's address", otherNode, ownerNode, tcActShot},
	}
	refused := 0
	for i, c := range cases {
		frame := udpFrame(peerHW, peerHW, c.src, podA, nil)
		binary.BigEndian.PutUint16(frame[14+20:], uint16(41000+i))
		if got := runOverlay(t, p, frame, c.sender, id); got != c.want {
			t.Errorf("%s: verdict %d, want %d", c.name, got, c.want)
		}
		if c.want == tcActShot {
			refused++
		}
	}
	if got := metric(t, p, "drop_tunnel_source"); got != uint64(refused) {
		t.Errorf("drop_tunnel_source = %d, want %d", got, refused)
	}
}

// denyAToB loads an Admin Deny of app=a towards app=b and returns both
// pods' identities; newRemote stays out of the ipcache: a new pod.
func denyAToB(t *testing.T, n *Node) (idA, idB policy.Identity) {
	t.Helper()
	deny := clusterPolicy(policy.KindClusterNetworkPolicy, "deny-a", npav1alpha2.AdminTier, 1, "b")
	deny.Spec.Ingress = []npav1alpha2.ClusterNetworkPolicyIngressRule{{
		Name: "no-a", Action: "Deny", From: []npav1alpha2.ClusterNetworkPolicyIngressPeer{fromApp("a")}}}
	res := loadCluster(t, n, deny)
	idA, idB = res.IPCache[podA], res.IPCache[podB]
	if _, known := res.IPCache[newRemote]; known || idA == 0 || idB == 0 {
		t.Fatalf("fixture: ipcache %v", res.IPCache)
	}
	return idA, idB
}

// TestOverlayIdentityJudgesNewPods: a pod whose address has not reached
// this node is judged by the identity its node put in the VNI, from its
// first packet; without one it is unidentified and denied wherever a
// policy applies, never "world".
func TestOverlayIdentityJudgesNewPods(t *testing.T) {
	p, n, rd := eventNode(t)
	withPeers(t, p)
	idA, idB := denyAToB(t, n)

	cases := []struct {
		name      string
		vni       uint32
		sender    netip.Addr
		want      uint32
		verdict   policy.Verdict
		stage     policy.Stage
		peer      policy.Identity
		toPodB    bool
		checkPeer bool
	}{
		{"denied identity in the VNI", uint32(idA), ownerNode, tcActShot, policy.VerdictDeny, policy.StageAdmin, idA, true, true},
		{"other identity in the VNI", uint32(idB), ownerNode, tcActRedirect, policy.VerdictAllow, policy.StageDefault, idB, true, true},
		{"no identity in the VNI", 0, ownerNode, tcActShot, policy.VerdictDeny, policy.StageUnidentified, policy.IdentityUnidentified, true, true},
		{"host identity in the VNI for a pod address", uint32(policy.IdentityHost), ownerNode, tcActShot, policy.VerdictDeny, policy.StageUnidentified, policy.IdentityUnidentified, true, true},
		{"no VNI at all (ipcache only)", 0, netip.Addr{}, tcActShot, policy.VerdictDeny, policy.StageUnidentified, policy.IdentityUnidentified, true, true},
		// Pod A has no policy: an unidentified peer is let in as before.
		{"unidentified peer of an unenforced pod", 0, ownerNode, tcActRedirect, policy.VerdictAllow, policy.StageUnenforced, policy.IdentityUnidentified, false, true},
	}
	for i, c := range cases {
		dst := podB
		if !c.toPodB {
			dst = podA
		}
		frame := udpFrame(peerHW, peerHW, newRemote, dst, nil)
		binary.BigEndian.PutUint16(frame[14+20:], uint16(42000+i))
		if got := runOverlay(t, p, frame, c.sender, c.vni); got != c.want {
			t.Errorf("%s: verdict %d, want %d", c.name, got, c.want)
			continue
		}
		ev := readEvent(t, rd)
		if ev.Verdict != c.verdict || ev.Stage != c.stage || ev.Peer != c.peer {
			t.Errorf("%s: event verdict %v stage %v peer %d, want %v %v %d", c.name, ev.Verdict, ev.Stage, ev.Peer, c.verdict, c.stage, c.peer)
		}
	}
}

// TestUnidentifiedPodAddressIsNeverWorld: from a local pod, a peer's pod
// address the ipcache does not know is denied under egress policy even
// when the policy allows the world (0.0.0.0/0 except the cluster), while
// an outside address stays world and allowed.
func TestUnidentifiedPodAddressIsNeverWorld(t *testing.T) {
	p, n, _ := eventNode(t)
	denyPods := clusterPolicy(policy.KindClusterNetworkPolicy, "no-cluster-peers", npav1alpha2.AdminTier, 1, "a")
	denyPods.Spec.Egress = []npav1alpha2.ClusterNetworkPolicyEgressRule{{
		Name: "deny-x", Action: "Deny", To: []npav1alpha2.ClusterNetworkPolicyEgressPeer{{Namespaces: &metav1.LabelSelector{}}}}}
	loadCluster(t, n, denyPods)
	if ret, _ := run(t, p.FromContainer, udpFrameTo(podA, newRemote, 53), ifA); ret != tcActShot {
		t.Errorf("A -> unidentified pod address: verdict %d, want drop", ret)
	}
	if ret, _ := run(t, p.FromContainer, udpFrameTo(podA, outside, 53), ifA); ret != tcActOK {
		t.Errorf("A -> outside address: verdict %d, want pass to the host", ret)
	}
}

// TestPodWithoutIdentityIsUnidentified: a pod whose label set has no
// SecurityIdentity (an API outage, a full identity space) is left out of
// the ipcache. It must not pass for "world" past a Deny that names its
// labels: from its first packet it is unidentified and denied wherever a
// policy applies.
func TestPodWithoutIdentityIsUnidentified(t *testing.T) {
	p, n, rd := eventNode(t)
	deny := clusterPolicy(policy.KindClusterNetworkPolicy, "deny-a", npav1alpha2.AdminTier, 1, "b")
	deny.Spec.Ingress = []npav1alpha2.ClusterNetworkPolicyIngressRule{{
		Name: "no-a", Action: "Deny", From: []npav1alpha2.ClusterNetworkPolicyIngressPeer{fromApp("a")}}}
	s := policyFixture()
	s.ClusterPolicies = []*policy.ClusterPolicy{deny}
	for key := range s.Identities {
		if strings.Contains(key, "k8s:app=a") {
			delete(s.Identities, key) // pods a and r: no identity
		}
	}
	res := loadPolicy(t, n, policy.NewCompiler(), nil, s)
	if _, ok := res.IPCache[podA]; ok || len(res.Unallocated) == 0 {
		t.Fatalf("fixture: pod A still in the ipcache (%v) or nothing unallocated (%v)", res.IPCache, res.Unallocated)
	}
	if ret, _ := run(t, p.FromContainer, udpFlow(podA, podB, 40000, 7777), ifA); ret != tcActShot {
		t.Fatalf("A (no identity) -> B under a Deny of app=a: verdict %d, want drop", ret)
	}
	for {
		ev := readEvent(t, rd)
		if ev.Direction == policy.Ingress {
			if ev.Stage != policy.StageUnidentified || ev.Peer != policy.IdentityUnidentified {
				t.Fatalf("B's event %+v, want denied as unidentified", ev)
			}
			break
		}
	}
}

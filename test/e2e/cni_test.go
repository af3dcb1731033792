package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/weirnet/weir/internal/api"
	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/testutil"
)

func confList(t *testing.T, socket, version string) *libcni.NetworkConfigList {
	t.Helper()
	l, err := libcni.NetworkConfFromBytes([]byte(fmt.Sprintf(
		`{"cniVersion":%q,"name":"weir","plugins":[{"type":"weir-cni","agentSocket":%q}]}`, version, socket)))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func newCNI(t *testing.T) *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir([]string{binDir}, t.TempDir(), nil)
}

// cniCode extracts the CNI error code libcni returns.
func cniCode(err error) uint {
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

func TestCNIAllSpecVersions(t *testing.T) {
	st := newLab(t, 1, 0, datapath.ModeVXLAN)
	node := st.Nodes[0]
	cni := newCNI(t)
	for _, v := range testutils.AllSpecVersions {
		t.Run(v, func(t *testing.T) {
			pod := testutil.NewNS(t)
			list := confList(t, node.Socket, v)
			rt := &libcni.RuntimeConf{ContainerID: "ctr-" + v, NetNS: pod.Path(), IfName: "eth0"}
			res, err := cni.AddNetworkList(context.Background(), list, rt)
			if strings.HasPrefix(v, "0.1") || strings.HasPrefix(v, "0.2") {
				// Those versions cannot express an interface list: refused.
				if cniCode(err) != types.ErrIncompatibleCNIVersion {
					t.Fatalf("ADD with spec %s: %v, want incompatible-version error", v, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if res.Version() != v {
				t.Fatalf("result version %s, want %s", res.Version(), v)
			}
			r, err := current.NewResultFromResult(res)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.IPs) != 1 || !node.PodCIDR.Contains(mustAddr(r.IPs[0].Address.IP)) {
				t.Fatalf("result IPs %v, want one address in %v", r.IPs, node.PodCIDR)
			}
			if v >= "0.4.0" {
				if err := cni.CheckNetworkList(context.Background(), list, rt); err != nil {
					t.Fatalf("CHECK: %v", err)
				}
			}
			if err := cni.DelNetworkList(context.Background(), list, rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if err := cni.DelNetworkList(context.Background(), list, rt); err != nil {
				t.Fatalf("second DEL: %v", err)
			}
		})
	}
	vi, err := cni.GetVersionInfo(context.Background(), "weir-cni")
	if err != nil {
		t.Fatal(err)
	}
	if !contains(vi.SupportedVersions(), "1.1.0") {
		t.Fatalf("VERSION lists %v, want 1.1.0 among them", vi.SupportedVersions())
	}
	s, err := node.Client().Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Endpoints) != 0 || s.MapEntries != 0 {
		t.Fatalf("after ADD/DEL of every version: %d endpoints, %d map entries", len(s.Endpoints), s.MapEntries)
	}
}

// invoke runs weir-cni directly, as a runtime would, and decodes its error.
func invoke(t *testing.T, command, stdin string, env ...string) (string, *types.Error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "weir-cni"))
	cmd.Env = append([]string{"CNI_COMMAND=" + command, "CNI_CONTAINERID=ctr1", "CNI_IFNAME=eth0", "CNI_PATH=" + binDir}, env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Run(); err == nil {
		return out.String(), nil
	}
	var e types.Error
	if err := json.Unmarshal(out.Bytes(), &e); err != nil {
		t.Fatalf("plugin failed without a CNI error on stdout: %q", out.String())
	}
	return out.String(), &e
}

func TestCNIBadInput(t *testing.T) {
	st := newLab(t, 1, 0, datapath.ModeVXLAN)
	sock := st.Nodes[0].Socket
	pod := testutil.NewNS(t)
	good := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"weir","type":"weir-cni","agentSocket":%q}`, sock)
	netns := "CNI_NETNS=" + pod.Path()
	cases := []struct {
		name, command, conf string
		env                 []string
		code                uint
		hint                string
	}{
		{"malformed JSON", "ADD", `{"cniVersion":"1.1.0",`, []string{netns}, types.ErrDecodingFailure, ""},
		{"unknown version", "ADD", strings.Replace(good, "1.1.0", "9.9.9", 1), []string{netns}, types.ErrIncompatibleCNIVersion, ""},
		{"no name", "ADD", strings.Replace(good, `"name":"weir",`, "", 1), []string{netns}, types.ErrInvalidNetworkConfig, "name"},
		{"relative socket", "ADD", strings.Replace(good, sock, "agent.sock", 1), []string{netns}, types.ErrInvalidNetworkConfig, "absolute"},
		{"ipam section", "ADD", strings.Replace(good, `"type":"weir-cni",`, `"type":"weir-cni","ipam":{"type":"host-local"},`, 1), []string{netns}, types.ErrInvalidNetworkConfig, "remove"},
		{"missing netns", "ADD", good, []string{"CNI_NETNS=/var/run/netns/weir-no-such-pod"}, api.CodeUnknownContainer, "namespace"},
		{"agent not running", "ADD", strings.Replace(good, sock, "/run/weir-no-agent.sock", 1), []string{netns}, types.ErrTryAgainLater, "agent"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, e := invoke(t, c.command, c.conf, c.env...)
			if e == nil || e.Code != c.code {
				t.Fatalf("got %+v, want code %d", e, c.code)
			}
			if !strings.Contains(strings.ToLower(e.Msg+e.Details), c.hint) {
				t.Fatalf("message %q does not say what to fix (%q)", e.Msg+": "+e.Details, c.hint)
			}
		})
	}
	s, err := st.Nodes[0].Client().Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Endpoints) != 0 || s.MapEntries != 0 {
		t.Fatalf("bad input left %d leases and %d map entries", len(s.Endpoints), s.MapEntries)
	}
}

func TestCNIDuplicateAddAndGC(t *testing.T) {
	st := newLab(t, 1, 0, datapath.ModeVXLAN)
	node := st.Nodes[0]
	cni := newCNI(t)
	list := confList(t, node.Socket, "1.1.0")
	var rts []*libcni.RuntimeConf
	for i := 0; i < 3; i++ {
		rt := &libcni.RuntimeConf{ContainerID: fmt.Sprint("ctr", i), NetNS: testutil.NewNS(t).Path(), IfName: "eth0"}
		if _, err := cni.AddNetworkList(context.Background(), list, rt); err != nil {
			t.Fatal(err)
		}
		rts = append(rts, rt)
	}
	_, err := cni.AddNetworkList(context.Background(), list, rts[0])
	if cniCode(err) != api.CodeAttachmentInUse {
		t.Fatalf("duplicate ADD: %v", err)
	}
	if err := cni.CheckNetworkList(context.Background(), list, rts[0]); err != nil {
		t.Fatalf("first attachment broken by duplicate ADD: %v", err)
	}
	err = cni.GCNetworkList(context.Background(), list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: "ctr1", IfName: "eth0"}}})
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	s, _ := node.Client().Status(context.Background())
	if len(s.Endpoints) != 1 || s.Endpoints[0].ContainerID != "ctr1" || s.MapEntries != 1 {
		t.Fatalf("after GC: %+v (map entries %d)", s.Endpoints, s.MapEntries)
	}
}

func TestCNIStatusFollowsAgent(t *testing.T) {
	st := newLab(t, 1, 0, datapath.ModeVXLAN)
	cni := newCNI(t)
	list := confList(t, st.Nodes[0].Socket, "1.1.0")
	if err := cni.GetStatusNetworkList(context.Background(), list); err != nil {
		t.Fatalf("STATUS with the agent up: %v", err)
	}
	if err := st.StopAgent("n1"); err != nil {
		t.Fatal(err)
	}
	if err := cni.GetStatusNetworkList(context.Background(), list); cniCode(err) != types.ErrPluginNotAvailable {
		t.Fatalf("STATUS with the agent down: %v, want code %d", err, types.ErrPluginNotAvailable)
	}
	rt := &libcni.RuntimeConf{ContainerID: "ctr", NetNS: testutil.NewNS(t).Path(), IfName: "eth0"}
	if _, err := cni.AddNetworkList(context.Background(), list, rt); cniCode(err) != types.ErrTryAgainLater {
		t.Fatalf("ADD with the agent down: %v, want code %d", err, types.ErrTryAgainLater)
	}
	if err := st.StartAgent(context.Background(), "n1"); err != nil {
		t.Fatal(err)
	}
	if err := cni.GetStatusNetworkList(context.Background(), list); err != nil {
		t.Fatalf("STATUS after restart: %v", err)
	}
	if _, err := cni.AddNetworkList(context.Background(), list, rt); err != nil {
		t.Fatalf("ADD after restart: %v", err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

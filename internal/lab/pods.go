package lab

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/weirnet/weir/internal/cni"
)

// cniConfList is the network config a runtime on the node would read from
// /etc/cni/net.d; the lab points each node's config at its own agent.
func (st *State) cniConfList(n *Node) (*libcni.NetworkConfigList, error) {
	conf := string(cni.ConfList(n.Socket, false))
	if st.Config.CNI == CNIBridge {
		conf = bridgeConfList(st, n)
	}
	return libcni.NetworkConfFromBytes([]byte(conf))
}

// CNI returns the libcni client the lab's "runtime" on node n uses: it
// runs plugins inside the node's namespace, as a runtime there would.
func (st *State) CNI(n *Node) *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir(st.PluginDirs, filepath.Join(st.RunDir, "cni-cache"), nodeExec{netns: nsPath(n.NetNS)})
}

func (st *State) runtimeConf(p Pod) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: p.ContainerID,
		NetNS:       nsPath(p.NetNS),
		IfName:      "eth0",
		Args:        [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "lab"}, {"K8S_POD_NAME", p.Name}},
	}
}

// AddPod creates a pod namespace on node and attaches it through libcni.
func (st *State) AddPod(ctx context.Context, node, name string) (_ *Pod, retErr error) {
	n, err := st.NodeByName(node)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(st.Config.Name + "/" + name))
	p := Pod{Name: name, Node: node, NetNS: st.Config.Name + "-" + name, ContainerID: hex.EncodeToString(sum[:])}
	if err := createNetNS(p.NetNS); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			deleteNetNS(p.NetNS)
		}
	}()
	list, err := st.cniConfList(n)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	res, err := st.CNI(n).AddNetworkList(ctx, list, st.runtimeConf(p))
	p.AddLatency = time.Since(start)
	if err != nil {
		return nil, fmt.Errorf("CNI ADD for pod %s: %w", name, err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return nil, err
	}
	if len(r.IPs) == 0 {
		return nil, fmt.Errorf("CNI ADD for pod %s returned no address", name)
	}
	p.IP, _ = netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
	st.Pods = append(st.Pods, p)
	return &p, st.save()
}

// DelPod detaches a pod through libcni and removes its namespace. It
// returns how long the CNI DEL took.
func (st *State) DelPod(ctx context.Context, name string) (time.Duration, error) {
	for i, p := range st.Pods {
		if p.Name != name {
			continue
		}
		n, err := st.NodeByName(p.Node)
		if err != nil {
			return 0, err
		}
		list, err := st.cniConfList(n)
		if err != nil {
			return 0, err
		}
		start := time.Now()
		if err := st.CNI(n).DelNetworkList(ctx, list, st.runtimeConf(p)); err != nil {
			return 0, fmt.Errorf("CNI DEL for pod %s: %w", name, err)
		}
		took := time.Since(start)
		if err := deleteNetNS(p.NetNS); err != nil {
			return took, err
		}
		st.Pods = append(st.Pods[:i], st.Pods[i+1:]...)
		return took, st.save()
	}
	return 0, fmt.Errorf("lab %s has no pod %q", st.Config.Name, name)
}

// PodByName finds a pod.
func (st *State) PodByName(name string) (*Pod, error) {
	for i := range st.Pods {
		if st.Pods[i].Name == name {
			return &st.Pods[i], nil
		}
	}
	return nil, fmt.Errorf("lab %s has no pod %q", st.Config.Name, name)
}

// PodNSPath is the namespace path of a pod.
func PodNSPath(p Pod) string { return nsPath(p.NetNS) }

// NodeNSPath is the namespace path of a node.
func NodeNSPath(n Node) string { return nsPath(n.NetNS) }

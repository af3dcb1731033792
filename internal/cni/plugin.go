package cni

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/weirnet/weir/internal/api"
	weirversion "github.com/weirnet/weir/internal/version"
)

// SupportedVersions are the CNI specification versions weir-cni speaks.
var SupportedVersions = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

// About is what skel prints when the plugin runs without CNI_COMMAND: a
// line for people, then this build's version.Info as JSON, which
// `weir version` reads.
func About() string {
	b, _ := json.Marshal(weirversion.Get())
	return "weir-cni: eBPF pod networking (asks weir-agent on the node), " + weirversion.Get().String() + "\n" + string(b)
}

// timeout bounds one call to the agent; kubelet's own is longer.
const timeout = 60 * time.Second

// Funcs are the plugin's command handlers for skel.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck, GC: cmdGC, Status: cmdStatus}
}

// k8sArgs are the CNI_ARGS kubelet passes.
type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE          types.UnmarshallableString //nolint:revive // CNI_ARGS key
	K8S_POD_NAME               types.UnmarshallableString //nolint:revive // CNI_ARGS key
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString //nolint:revive // CNI_ARGS key
	K8S_POD_UID                types.UnmarshallableString //nolint:revive // CNI_ARGS key
}

func cmdAdd(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	var ka k8sArgs
	ka.IgnoreUnknown = true
	if err := types.LoadArgs(args.Args, &ka); err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_ARGS is malformed", err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	resp, err := api.NewClient(conf.AgentSocket).Add(ctx, api.AddRequest{
		Attachment:   api.Attachment{ContainerID: args.ContainerID, IfName: args.IfName},
		NetNS:        args.Netns,
		PodNamespace: string(ka.K8S_POD_NAMESPACE),
		PodName:      string(ka.K8S_POD_NAME),
		PortMappings: conf.RuntimeConfig.PortMappings,
	})
	if err != nil {
		return cniError(err)
	}
	return types.PrintResult(result(resp, conf.CNIVersion), conf.CNIVersion)
}

// result converts the agent's answer into a CNI result.
func result(r *api.AddResponse, cniVersion string) *current.Result {
	mac, _ := net.ParseMAC(r.MAC)
	hostMAC, _ := net.ParseMAC(r.HostMAC)
	idx := 1
	gw := net.IP(r.Gateway.AsSlice())
	return &current.Result{
		CNIVersion: cniVersion,
		Interfaces: []*current.Interface{
			{Name: r.HostIfName, Mac: hostMAC.String()},
			{Name: r.IfName, Mac: mac.String(), Sandbox: r.NetNS, Mtu: r.MTU},
		},
		IPs: []*current.IPConfig{{
			Interface: &idx,
			Address:   net.IPNet{IP: net.IP(r.Address.Addr().AsSlice()), Mask: net.CIDRMask(r.Address.Bits(), r.Address.Addr().BitLen())},
			Gateway:   gw,
		}},
		Routes: []*types.Route{{Dst: defaultDst(r), GW: gw}},
	}
}

func defaultDst(r *api.AddResponse) net.IPNet {
	if r.Address.Addr().Is4() {
		return net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	}
	return net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
}

func cmdDel(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err = api.NewClient(conf.AgentSocket).Del(ctx, api.DelRequest{
		Attachment: api.Attachment{ContainerID: args.ContainerID, IfName: args.IfName},
		NetNS:      args.Netns,
	})
	return cniError(err)
}

func cmdCheck(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err = api.NewClient(conf.AgentSocket).Check(ctx, api.CheckRequest{
		Attachment: api.Attachment{ContainerID: args.ContainerID, IfName: args.IfName},
		NetNS:      args.Netns,
	})
	return cniError(err)
}

func cmdGC(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	req := api.GCRequest{Valid: make([]api.Attachment, 0, len(conf.ValidAttachments))}
	for _, v := range conf.ValidAttachments {
		req.Valid = append(req.Valid, api.Attachment{ContainerID: v.ContainerID, IfName: v.IfName})
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err = api.NewClient(conf.AgentSocket).GC(ctx, req)
	return cniError(err)
}

func cmdStatus(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := api.NewClient(conf.AgentSocket).Health(ctx); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, "weir-agent is not ready on this node", err.Error())
	}
	return nil
}

// cniError converts an agent error into a CNI error with the same code.
func cniError(err error) error {
	if err == nil {
		return nil
	}
	var e *api.Error
	if errors.As(err, &e) {
		return types.NewError(e.Code, e.Msg, e.Details)
	}
	if errors.Is(err, api.ErrAgentUnavailable) {
		return types.NewError(types.ErrTryAgainLater, "weir-agent is not reachable; start it or check agentSocket", err.Error())
	}
	return types.NewError(types.ErrIOFailure, "talking to weir-agent failed", err.Error())
}

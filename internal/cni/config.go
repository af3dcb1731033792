package cni

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/weirnet/weir/internal/api"
)

// NetConf is weir-cni's network configuration.
type NetConf struct {
	types.PluginConf
	// AgentSocket is the node agent's unix socket.
	AgentSocket string `json:"agentSocket,omitempty"`
	// RuntimeConfig holds what the runtime passes for the capabilities
	// the conflist declares: the pod's hostPorts.
	RuntimeConfig struct {
		PortMappings []api.PortMapping `json:"portMappings,omitempty"`
	} `json:"runtimeConfig,omitempty"`
}

// parseConf decodes and validates stdin.
func parseConf(stdin []byte) (*NetConf, error) {
	conf := &NetConf{AgentSocket: api.DefaultSocket}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "network configuration is not valid JSON", err.Error())
	}
	if conf.Name == "" {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "network configuration has no \"name\"", "set \"name\" to the network's name")
	}
	if !filepath.IsAbs(conf.AgentSocket) {
		return nil, types.NewError(types.ErrInvalidNetworkConfig,
			fmt.Sprintf("\"agentSocket\" %q is not an absolute path", conf.AgentSocket),
			"set it to the agent's socket, by default "+api.DefaultSocket)
	}
	for i, m := range conf.RuntimeConfig.PortMappings {
		m.Protocol = strings.ToLower(m.Protocol)
		if m.Protocol == "" {
			m.Protocol = "tcp"
		}
		if err := m.Validate(); err != nil {
			return nil, types.NewError(types.ErrInvalidNetworkConfig, "runtimeConfig.portMappings: "+err.Error(), "the runtime passed a hostPort Weir cannot serve")
		}
		conf.RuntimeConfig.PortMappings[i] = m
	}
	if conf.IPAM.Type != "" {
		return nil, types.NewError(types.ErrInvalidNetworkConfig,
			fmt.Sprintf("\"ipam\" type %q is not supported", conf.IPAM.Type),
			"remove the \"ipam\" section: weir-agent assigns pod addresses itself")
	}
	return conf, nil
}

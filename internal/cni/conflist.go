package cni

import "fmt"

// ConfListName is the file weir-agent writes into the runtime's CNI
// configuration directory once it is ready; the low number puts it first.
const ConfListName = "05-weir.conflist"

// ConfList is the network configuration a runtime reads to call weir-cni,
// pointing the plugin at the agent's socket. With hostPorts it declares
// the portMappings capability, so the runtime passes each pod's hostPorts
// and the agent serves them (with no kube-proxy beside it).
func ConfList(agentSocket string, hostPorts bool) []byte {
	caps := ""
	if hostPorts {
		caps = `,"capabilities":{"portMappings":true}`
	}
	return fmt.Appendf(nil, `{"cniVersion":"1.1.0","name":"weir","plugins":[{"type":"weir-cni","agentSocket":%q%s}]}`, agentSocket, caps)
}

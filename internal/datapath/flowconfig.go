package datapath

import (
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// flowConfigPin is the pinned name of the events switch (bpf/lib/events.h).
const flowConfigPin = "weir_flow_config"

// SetFlowEvents turns the node's verdict events, and so its flow records,
// on or off. It takes effect on the next new connection.
func (n *Node) SetFlowEvents(on bool) error {
	return setFlowEvents(n.progs.FlowConfig, on)
}

// SetPinnedFlowEvents does what SetFlowEvents does through the map pinned
// in pinDir: the datapath benchmark flips a running lab's events so that
// flows on and off are measured on the same pods and devices.
func SetPinnedFlowEvents(pinDir string, on bool) error {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, flowConfigPin), nil)
	if err != nil {
		return fmt.Errorf("open the flow events switch in %s: %w", pinDir, err)
	}
	defer m.Close()
	return setFlowEvents(m, on)
}

func setFlowEvents(m *ebpf.Map, on bool) error {
	var noEvents uint32
	if !on {
		noEvents = 1
	}
	if err := m.Put(uint32(0), noEvents); err != nil {
		return fmt.Errorf("set flow events %v: %w", on, err)
	}
	return nil
}

package agent

import (
	"net/netip"
	"time"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/policy"
	"github.com/weirnet/weir/internal/service"
)

// Datapath is what the agent needs from the node's datapath. The ADD steps
// are separate methods so a failure between any two can be rolled back and
// tested; *datapath.Node implements it.
type Datapath interface {
	CreateVeth(datapath.EndpointSpec) (*datapath.Endpoint, error)
	ConfigurePod(*datapath.Endpoint) error
	ConfigureHost(*datapath.Endpoint) error
	AttachProgram(*datapath.Endpoint) error
	Publish(*datapath.Endpoint) error
	IsolateEndpoint(*datapath.Endpoint) error

	RemoveEndpoint(datapath.EndpointSpec) error
	CheckEndpoint(datapath.EndpointSpec) error
	AdoptEndpoint(datapath.EndpointSpec) (*datapath.Endpoint, error)
	SweepOrphans(keep map[string]bool) ([]string, error)

	SetPeers([]datapath.Peer) error
	ApplyPolicy(policy.Diff, map[string]datapath.PolicyEndpoint) error
	PrunePolicy(*policy.Result, map[string]datapath.PolicyEndpoint) error
	GCRevokedFlows(idle time.Duration) (int, error)
	MapCapacity(name string) (int, error)
	SetServices(service.Table) error
	UpdateServices(map[service.Frontend]*service.Entry) error
	SetNodeAddrs([]netip.Addr) error
	Services() (service.Table, error)
	CloseServiceSockets(removed map[service.Frontend][]service.Backend, netnsPaths []string) error
	L7ResetPending() bool
	ResetClosedL7(netnsOf func(netip.Addr) (string, bool)) (int, error)
	Endpoints() ([]datapath.EndpointEntry, error)
	Metrics() (map[string]uint64, error)
	PodMTU() int
}

var _ Datapath = (*datapath.Node)(nil)

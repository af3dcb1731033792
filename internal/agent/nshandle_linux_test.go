package agent

import (
	"github.com/containernetworking/plugins/pkg/ns"
	vns "github.com/vishvananda/netns"
)

func nsHandle(n ns.NetNS) vns.NsHandle { return vns.NsHandle(int(n.Fd())) }

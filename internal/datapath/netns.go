package datapath

import (
	"github.com/containernetworking/plugins/pkg/ns"
	vns "github.com/vishvananda/netns"
)

// netnsHandle converts a plugins ns.NetNS into the handle netlink wants.
// The fd stays owned by the ns.NetNS.
func netnsHandle(n ns.NetNS) vns.NsHandle { return vns.NsHandle(int(n.Fd())) }

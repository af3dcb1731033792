// Command weir-cni is Weir's CNI plugin. Container runtimes execute it; it
// forwards each command to the weir-agent of the node.
package main

import (
	"runtime"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/weirnet/weir/internal/cni"
)

func init() {
	// The plugin never switches namespaces, but a locked main thread keeps
	// it safe to call code that does.
	runtime.LockOSThread()
}

func main() {
	skel.PluginMainFuncs(cni.Funcs(), cni.SupportedVersions, cni.About())
}

package agent

import (
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/service"
)

// reasonServiceNotProgrammed is the Warning event on a Service whose
// frontends a node's full service maps could not take.
const reasonServiceNotProgrammed = "ServiceNotProgrammed"

// serviceEvents tells the owners of Services that this node's service maps
// had no room for them, with a Warning event on the Service (beside the
// log line, weir status and the map fill metric): a frontend left out keeps
// the backends it had, or is not translated at all, never sent to part of
// its new backends. Each node says it once per message, again only after
// the message changed or the Service was programmed in between.
type serviceEvents struct {
	rec  record.EventRecorder // nil outside Kubernetes
	node string
	sent map[string]string // namespace/name -> the message last sent
}

// report sends an event for each Service with a frontend err (from
// SetServices or UpdateServices; nil after a write that succeeded) says a
// full map left out. owner names each frontend's Service (or pod, for a
// hostPort) and lookup finds a Service by namespace/name.
func (se *serviceEvents) report(err error, owner func(service.Frontend) string, lookup func(string) *corev1.Service) {
	if se.rec == nil {
		return
	}
	left := map[string][]string{} // Service -> frontends left out
	for _, fe := range datapath.FrontendErrors(err) {
		if !errors.Is(fe, datapath.ErrServiceMapFull) {
			continue
		}
		o := owner(fe.Frontend)
		if lookup(o) == nil {
			continue // a pod's hostPort, or a Service gone meanwhile
		}
		left[o] = append(left[o], frontendString(fe.Frontend))
	}
	now := make(map[string]string, len(left))
	for owner, frontends := range left {
		msg := fmt.Sprintf("node %s has no room in its service maps for %s: new connections there keep the backends they had before, or are not translated; "+
			"see weir_map_fill_ratio and `weir service list` on that node, and remove unused Services or frontends", se.node, strings.Join(frontends, ", "))
		now[owner] = msg
		if se.sent[owner] == msg {
			continue
		}
		svc := lookup(owner)
		ref := &corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: svc.Namespace, Name: svc.Name, UID: svc.UID, ResourceVersion: svc.ResourceVersion}
		se.rec.Event(ref, corev1.EventTypeWarning, reasonServiceNotProgrammed, msg)
	}
	se.sent = now
}

// frontendString names a frontend as a user reads it: 10.96.0.10:53/UDP,
// with "(from outside)" for the entries packets from outside pick.
func frontendString(f service.Frontend) string {
	s := fmt.Sprintf("%v:%d/%s", f.Addr, f.Port, protocolName(f.Proto))
	if f.External {
		s += " (from outside)"
	}
	return s
}

package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/weirnet/weir/internal/datapath"
	"github.com/weirnet/weir/internal/service"
)

// eventLog records the events sent, with the object each is about.
type eventLog struct{ events []sentEvent }

type sentEvent struct {
	obj                   *corev1.ObjectReference
	kind, reason, message string
}

func (l *eventLog) Event(obj runtime.Object, kind, reason, message string) {
	ref, _ := obj.(*corev1.ObjectReference)
	l.events = append(l.events, sentEvent{ref, kind, reason, message})
}

func (l *eventLog) Eventf(obj runtime.Object, kind, reason, format string, args ...any) {
	l.Event(obj, kind, reason, fmt.Sprintf(format, args...))
}

func (l *eventLog) AnnotatedEventf(obj runtime.Object, _ map[string]string, kind, reason, format string, args ...any) {
	l.Eventf(obj, kind, reason, format, args...)
}

// take returns the events sent since the last take.
func (l *eventLog) take() []sentEvent {
	out := l.events
	l.events = nil
	return out
}

// TestServiceEventsNameTheServicesAFullMapLeftOut: frontends a full map
// left out give one Warning event on each Service they belong to, naming
// the node and the frontends; other write errors, hostPorts and gone
// Services give none; the same refusal is said once, and again only after
// the Service was programmed in between.
func TestServiceEventsNameTheServicesAFullMapLeftOut(t *testing.T) {
	log := &eventLog{}
	se := serviceEvents{rec: log, node: "n1"}
	svcs := map[string]*corev1.Service{
		"shop/web": {ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", UID: "u-web"}},
		"shop/db":  {ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db", UID: "u-db"}},
	}
	lookup := func(key string) *corev1.Service { return svcs[key] }
	web := service.Frontend{Addr: netip.MustParseAddr("10.96.0.20"), Port: 80, Proto: service.ProtoTCP}
	webOut := service.Frontend{Addr: netip.MustParseAddr("10.99.0.11"), Port: 30080, Proto: service.ProtoTCP, External: true}
	db := service.Frontend{Addr: netip.MustParseAddr("10.96.0.30"), Port: 5432, Proto: service.ProtoTCP}
	hostPort := service.Frontend{Addr: netip.MustParseAddr("10.99.0.11"), Port: 31900, Proto: service.ProtoTCP}
	owners := map[service.Frontend]string{web: "shop/web", webOut: "shop/web", db: "shop/db", hostPort: "shop/echo (hostPort)"}
	owner := func(f service.Frontend) string { return owners[f] }
	full := fmt.Errorf("%w: argument list too long", datapath.ErrServiceMapFull)
	err := errors.Join(
		&datapath.FrontendError{Frontend: web, Err: full},
		&datapath.FrontendError{Frontend: webOut, Err: fmt.Errorf("maglev table: %w", full)},
		&datapath.FrontendError{Frontend: db, Err: errors.New("permission denied")},
		&datapath.FrontendError{Frontend: hostPort, Err: full},
		errors.New("delete service: bad file descriptor"),
	)

	se.report(err, owner, lookup)
	got := log.take()
	if len(got) != 1 {
		t.Fatalf("events %+v, want one, on shop/web", got)
	}
	e := got[0]
	if e.obj == nil || e.obj.Kind != "Service" || e.obj.Namespace != "shop" || e.obj.Name != "web" || e.obj.UID != "u-web" {
		t.Errorf("event on %+v, want the Service shop/web", e.obj)
	}
	if e.kind != corev1.EventTypeWarning || e.reason != reasonServiceNotProgrammed {
		t.Errorf("event %s %s, want Warning %s", e.kind, e.reason, reasonServiceNotProgrammed)
	}
	for _, want := range []string{"node n1", "10.96.0.20:80/TCP", "10.99.0.11:30080/TCP (from outside)"} {
		if !strings.Contains(e.message, want) {
			t.Errorf("message %q lacks %q", e.message, want)
		}
	}

	se.report(err, owner, lookup)
	if got := log.take(); len(got) != 0 {
		t.Errorf("the same refusal warned again: %+v", got)
	}
	se.report(nil, owner, lookup) // programmed
	se.report(err, owner, lookup)
	if got := log.take(); len(got) != 1 {
		t.Errorf("after being programmed in between: %+v, want the warning again", got)
	}
	clear(svcs) // web deleted
	se.report(nil, owner, lookup)
	se.report(err, owner, lookup)
	if got := log.take(); len(got) != 0 {
		t.Errorf("events about Services that are gone: %+v", got)
	}
}

// TestServiceEventsOutsideKubernetes: without a recorder nothing is sent
// and nothing fails.
func TestServiceEventsOutsideKubernetes(t *testing.T) {
	var se serviceEvents
	se.report(&datapath.FrontendError{Err: datapath.ErrServiceMapFull}, func(service.Frontend) string { return "a/b" },
		func(string) *corev1.Service {
			return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "b"}}
		})
}

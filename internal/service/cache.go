package service

import (
	"cmp"
	"maps"
	"reflect"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Cache keeps the table of the cluster's Services current one Service at a
// time: a change to a Service or to its EndpointSlices recomputes that
// Service's frontends alone and reports the frontends whose translation
// changed, so the cost of a change does not grow with the number of
// Services. Build is a Cache filled at once.
//
// Frontends two Services claim (an externalIP set to another Service's
// ClusterIP, say) go to a ClusterIP over the rest, then to the older
// Service, then by namespace and name: never to the order changes came in.
// A Cache is not safe for concurrent use.
type Cache struct {
	opts     Options
	services map[string]*corev1.Service
	slices   map[string][]*discoveryv1.EndpointSlice
	// claimsBy holds what each Service claims; claims, every claim on
	// each frontend. table and owners are the claims' winners.
	claimsBy map[string][]claim
	claims   map[Frontend][]claim
	table    Table
	owners   map[Frontend]string
	dirty    map[string]bool
	// healthChecked are the Services with a health check node port.
	healthChecked map[string]bool
}

// claim is one Service's claim on one frontend.
type claim struct {
	Frontend
	svc  *corev1.Service
	key  string // namespace/name
	seq  int    // order among the Service's own claims
	rank bool   // a ClusterIP: it wins over the rest
	// serves says entry applies; a claim that does not (no backends
	// beside kube-proxy, or another node's frontend without endpoints
	// there) still names its Service as the frontend's owner.
	serves bool
	entry  Entry
}

// NewCache is an empty cache building tables as opts says.
func NewCache(opts Options) *Cache {
	return &Cache{
		opts: opts, services: map[string]*corev1.Service{}, slices: map[string][]*discoveryv1.EndpointSlice{},
		claimsBy: map[string][]claim{}, claims: map[Frontend][]claim{}, table: Table{}, owners: map[Frontend]string{},
		dirty: map[string]bool{}, healthChecked: map[string]bool{},
	}
}

// Key is how a Service is named in a Cache: "namespace/name".
func Key(namespace, name string) string { return namespace + "/" + name }

// SliceService is the key of the Service an EndpointSlice belongs to, ""
// for a slice that names none.
func SliceService(s *discoveryv1.EndpointSlice) string {
	name := s.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return ""
	}
	return Key(s.Namespace, name)
}

// GroupSlices sorts EndpointSlices by the Service they belong to.
func GroupSlices(endpointSlices []*discoveryv1.EndpointSlice) map[string][]*discoveryv1.EndpointSlice {
	out := map[string][]*discoveryv1.EndpointSlice{}
	for _, s := range endpointSlices {
		if k := SliceService(s); k != "" {
			out[k] = append(out[k], s)
		}
	}
	return out
}

// SetOptions changes whose view the table is built for. When it differs
// from the last, every Service is recomputed on the next Flush.
func (c *Cache) SetOptions(opts Options) {
	if reflect.DeepEqual(opts, c.opts) {
		return
	}
	c.opts = opts
	for k := range c.services {
		c.dirty[k] = true
	}
}

// Update records the current state of the Service key: svc (nil once it
// is deleted) and its EndpointSlices, all of them. It takes effect on the
// next Flush.
func (c *Cache) Update(key string, svc *corev1.Service, endpointSlices []*discoveryv1.EndpointSlice) {
	if svc == nil {
		delete(c.services, key)
		delete(c.healthChecked, key)
	} else {
		c.services[key] = svc
		if _, ok := healthCheckPort(svc); ok {
			c.healthChecked[key] = true
		} else {
			delete(c.healthChecked, key)
		}
	}
	if len(endpointSlices) == 0 {
		delete(c.slices, key)
	} else {
		c.slices[key] = endpointSlices
	}
	c.dirty[key] = true
}

// Flush recomputes the Services updated since the last Flush and returns
// the frontends whose entry or owner changed (added, changed or gone),
// sorted.
func (c *Cache) Flush() []Frontend {
	touched := map[Frontend]bool{}
	for key := range c.dirty {
		for _, cl := range c.claimsBy[key] {
			c.claims[cl.Frontend] = slices.DeleteFunc(c.claims[cl.Frontend], func(o claim) bool { return o.key == key })
			touched[cl.Frontend] = true
		}
		claims := c.claimsOf(key)
		if len(claims) == 0 {
			delete(c.claimsBy, key)
		} else {
			c.claimsBy[key] = claims
		}
		for _, cl := range claims {
			c.claims[cl.Frontend] = append(c.claims[cl.Frontend], cl)
			touched[cl.Frontend] = true
		}
	}
	clear(c.dirty)
	var changed []Frontend
	for f := range touched {
		if c.resolve(f) {
			changed = append(changed, f)
		}
	}
	slices.SortFunc(changed, CompareFrontends)
	return changed
}

// resolve gives frontend f to the claims that win it and reports whether
// its entry or owner changed.
func (c *Cache) resolve(f Frontend) bool {
	all := c.claims[f]
	if len(all) == 0 {
		delete(c.claims, f)
	}
	var owner, serving *claim
	for i := range all {
		cl := &all[i]
		if owner == nil || cl.before(owner) {
			owner = cl
		}
		if cl.serves && (serving == nil || cl.before(serving)) {
			serving = cl
		}
	}
	oldEntry, had := c.table[f]
	oldOwner, hadOwner := c.owners[f]
	changed := false
	if serving == nil {
		delete(c.table, f)
		changed = had
	} else {
		c.table[f] = serving.entry
		changed = !had || !oldEntry.Equal(serving.entry)
	}
	if owner == nil {
		delete(c.owners, f)
		return changed || hadOwner
	}
	c.owners[f] = owner.key
	return changed || oldOwner != owner.key
}

// before says whether claim a takes a frontend from b: a ClusterIP over
// the rest, then the older Service, then by namespace and name, then a
// Service's earlier claim.
func (a *claim) before(b *claim) bool {
	if a.rank != b.rank {
		return a.rank
	}
	if a.key == b.key {
		return a.seq < b.seq
	}
	return comparePrecedence(a.svc, b.svc) < 0
}

// claimsOf computes what the Service key claims, as seen from c.opts.
func (c *Cache) claimsOf(key string) []claim {
	svc := c.services[key]
	if svc == nil || !Proxied(svc.Labels) {
		return nil
	}
	var eps []*discoveryv1.EndpointSlice
	for _, s := range c.slices[key] {
		if s.AddressType == discoveryv1.AddressTypeIPv4 && Proxied(s.Labels) {
			eps = append(eps, s)
		}
	}
	opts := c.opts
	serves := translatable(svc, opts.ReplaceKubeProxy)
	local := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	externalLocal := svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	affinity := affinityTimeout(svc)
	var out []claim
	for i, fe := range frontendsOf(svc, opts) {
		cl := claim{Frontend: fe.Frontend, svc: svc, key: key, seq: i, rank: fe.internal}
		if serves {
			onlyLocal := (fe.internal && local) || (fe.External && externalLocal)
			view := opts
			if fe.onlyNode != "" {
				onlyLocal, view.Node = true, fe.onlyNode
			}
			bes := backends(eps, fe.port, view, onlyLocal)
			// Without backends, kube-proxy rejects it; or the other
			// node drops it.
			cl.serves = len(bes) > 0 || (opts.ReplaceKubeProxy && fe.onlyNode == "")
			cl.entry = Entry{Backends: bes, AffinityTimeout: affinity, DropWhenEmpty: fe.External && externalLocal && len(bes) == 0}
		}
		out = append(out, cl)
	}
	return out
}

// Table is the cache's table as of the last Flush. It is the cache's own:
// callers read it and never write.
func (c *Cache) Table() Table { return c.table }

// Owner names the Service ("namespace/name") frontend f belongs to, for
// showing a table to people; "" for none.
func (c *Cache) Owner(f Frontend) string { return c.owners[f] }

// Service is the Service key as last updated; nil if there is none.
func (c *Cache) Service(key string) *corev1.Service { return c.services[key] }

// Keys lists the Services the cache holds.
func (c *Cache) Keys() []string { return slices.Sorted(maps.Keys(c.services)) }

// HealthChecks lists the health check node ports this node (the Options'
// Node) serves, by port: one per LoadBalancer Service with
// externalTrafficPolicy: Local.
func (c *Cache) HealthChecks() map[uint16]HealthCheck {
	out := map[uint16]HealthCheck{}
	by := map[uint16]*corev1.Service{}
	for key := range c.healthChecked {
		svc := c.services[key]
		port, _ := healthCheckPort(svc)
		// Two Services given one port (the API server allocates them
		// apart): the one that wins shared frontends answers.
		if have := by[port]; have != nil && comparePrecedence(have, svc) < 0 {
			continue
		}
		by[port], out[port] = svc, healthCheckOf(svc, c.slices[key], c.opts.Node)
	}
	return out
}

// CompareFrontends orders frontends by address, port, protocol, and the
// entry for sockets before the one for packets from outside.
func CompareFrontends(a, b Frontend) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Proto, b.Proto), compareBool(a.External, b.External))
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

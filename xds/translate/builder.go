package translate

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"slices"
	"sort"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"

	"github.com/servemesh/servemesh/internal/parallel"
	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
	"github.com/servemesh/servemesh/xds/cache"
)

// Builder builds what Shared builds, again and again as the model changes,
// rebuilding only the backends and endpoints that changed since its last
// Build (those the model's delta names, ir.Delta, when it follows the last
// Build; else every one is compared with what it was built from): a
// backend's clusters and assignments depend on the backend alone,
// an endpoint's routes on the endpoint alone, so what did not change is
// the same resource as before (the same pointer, which callers may use to
// tell what changed). Each part is hashed once, when it is built; a
// kind's version is the hash of its parts' hashes. A Builder is not safe
// for concurrent use.
type Builder struct {
	mtls *MTLS
	gen  uint64
	// cache holds the parts: each backend's (KindBackendParts), each
	// endpoint's (KindEndpointParts), each route key's public table
	// (KindRouteTable) and each node's (KindNodeParts, nodebuilder.go).
	// Off, nothing is reused and what changed is decided by comparing
	// versions with the last Build's parts (cache.Of.Last).
	cache *cache.Cache
	// backends, endpoints, tables and nodes are its kinds.
	backends  cache.Of[*backendParts]
	endpoints cache.Of[*endpointParts]
	tables    cache.Of[*publicGroup]
	nodes     cache.Of[*nodeParts]
	// assignments index every backend's assignments by name, kept as
	// backends are rebuilt (syncBackends): a full mTLS publish has tens
	// of thousands, which a map built anew at each Build, and a sort, cost
	// a tenth of its time.
	assignments map[string]Encoded
	// last is the last Build's output, whose kinds are kept whole while
	// none of their parts changed.
	last *Built
	// byNode indexes, with mTLS, the backends with replicas on each node;
	// nil until nodeBackends needs it after a change.
	byNode map[string]map[string]bool
	// tracing is the last Build's: every node's listeners trace with it.
	tracing *ir.Tracing
	// seq is the last Build's data plane's (ir.DataPlane.Seq): a data
	// plane whose Changes follow it names what to look at again.
	seq uint64
}

// The kinds of the builder's entries in its cache (xds/cache), each a
// row of docs/architecture.md's table of caches.
const (
	KindBackendParts  = "translate/backend"
	KindEndpointParts = "translate/endpoint"
	KindRouteTable    = "translate/route-table"
	KindNodeParts     = "translate/node"
)

// builderKinds are every kind a builder keeps in its cache.
var builderKinds = []string{KindBackendParts, KindEndpointParts, KindRouteTable, KindNodeParts}

// Option tunes a Builder.
type Option func(*Builder)

// Uncached makes a builder whose cache is off: it reuses nothing.
func Uncached() Option { return WithCache(cache.New(cache.Off)) }

// WithCache makes a builder keep its parts in c (the xDS server's, which
// holds its own entries there too); a builder makes its own by default.
func WithCache(c *cache.Cache) Option { return func(b *Builder) { b.cache = c } }

type backendParts struct {
	gen         uint64
	backend     ir.Backend
	clusters    []*cluster.Cluster
	encoded     []versionedCluster // clusters, encoded
	assignments []Encoded          // sent as they are, so held encoded
	hash        string             // of its clusters
	config      string             // with mTLS, of the backend without its replicas (configHash)
	nodes       []string           // with mTLS, the nodes it has replicas on
	perNode     map[string]int     // and how many on each
}

type endpointParts struct {
	gen      uint64
	endpoint ir.Endpoint
	mesh     Encoded // its mesh routes, versioned by their encoding
	scope    *route.ScopedRouteConfiguration
	// encodedScope is scope encoded, versioned by its encoding.
	encodedScope Encoded
	// meshClusters are the clusters its mesh routes send to.
	meshClusters []string
	// The hash of the other parts, so that a change versions only the
	// resources it changed: a traffic change alters the mesh routes and
	// the public ones, never the scope. publicHash is empty when the
	// endpoint is headless: its public routes are built again when its
	// route key's table is (publicRoutes), not held.
	publicHash string
}

// Built is one Build's output: Shared's resources (the route
// configurations and assignments encoded, as they are sent), each kind's
// version, each resource's version, and which backends' parts were
// rebuilt.
type Built struct {
	// Routes are each endpoint's mesh routes, then the public table, as
	// BuildRoutes lists them, encoded and versioned.
	Routes       []Encoded
	ScopedRoutes []*route.ScopedRouteConfiguration
	// EncodedScopes are ScopedRoutes encoded, in their order, as they are
	// sent.
	EncodedScopes []Encoded
	Clusters      []*cluster.Cluster
	// EncodedClusters are Clusters encoded, in their order, as they are
	// sent.
	EncodedClusters []Encoded
	// Assignments are every backend's, encoded and versioned, by name:
	// the builder's own map, read-only, which its next Build changes.
	Assignments map[string]Encoded
	// RouteClusters are the clusters each mesh route configuration sends
	// to, by its name.
	RouteClusters map[string][]string
	// RoutesVersion, ScopesVersion and ClustersVersion version each kind:
	// a kind keeps its version while none of its resources changes.
	RoutesVersion, ScopesVersion, ClustersVersion string
	// ScopeVersions and ClusterVersions version each resource by name, as
	// delta xDS compares them: a resource keeps its version while what it
	// was built from is unchanged. Read-only: a later Build makes new maps.
	ScopeVersions, ClusterVersions map[string]string
	// ChangedBackends are the backends rebuilt (or gone) by this Build.
	ChangedBackends map[string]bool
	// Changed names every shared resource this Build built anew or
	// dropped (ChangeSet).
	Changed ChangeSet
	// meshRoutes is how many of Routes are endpoints' mesh routes (the
	// rest are public tables).
	meshRoutes int
}

// NewBuilder returns a builder for a mesh whose mTLS is t (nil: none).
func NewBuilder(t *MTLS, opts ...Option) *Builder {
	b := &Builder{mtls: t, assignments: map[string]Encoded{}}
	for _, o := range opts {
		o(b)
	}
	if b.cache == nil {
		b.cache = cache.New(cache.On)
	}
	b.backends = cache.KindOf[*backendParts](b.cache, KindBackendParts)
	b.endpoints = cache.KindOf[*endpointParts](b.cache, KindEndpointParts)
	b.tables = cache.KindOf[*publicGroup](b.cache, KindRouteTable)
	b.nodes = cache.KindOf[*nodeParts](b.cache, KindNodeParts)
	b.forget()
	return b
}

// forget drops every part the builder's cache holds: a new builder (a
// new mesh mTLS changes every cluster) or one whose Build failed starts
// over.
func (b *Builder) forget() {
	for _, k := range builderKinds {
		b.cache.Clear(k)
	}
}

// Cache is where the builder keeps its parts.
func (b *Builder) Cache() *cache.Cache { return b.cache }

// backendParts is a backend's parts as last built, whatever the cache's
// mode (what a change is compared with).
func (b *Builder) lastBackend(name string) *backendParts {
	return b.backends.Last(name)
}

// MTLS is the mesh's mTLS the builder builds for.
func (b *Builder) MTLS() *MTLS { return b.mtls }

// Build returns the shared resources of m, a model that passed Validate.
// After an error it starts over: the next Build rebuilds everything.
func (b *Builder) Build(m *ir.DataPlane) (out *Built, err error) {
	defer func() {
		if err != nil {
			*b = *NewBuilder(b.mtls, WithCache(b.cache))
		}
	}()
	if b.mtls != nil {
		if err := b.mtls.Validate(); err != nil {
			return nil, err
		}
	}
	b.gen++
	b.tracing = m.Tracing
	set := ChangeSet{}
	// What changed is what m's delta names, carried from its source; after
	// a fresh start, with the cache off (the oracle) or when the delta does
	// not follow the last Build, every backend and endpoint is compared.
	var delta *ir.Delta
	if b.last != nil && b.cache.On() && m.Changes.Follows(b.seq) {
		delta = m.Changes
	}
	changed, err := b.syncBackends(m, delta, set)
	if err != nil {
		return nil, err
	}
	endpoints, err := b.syncEndpoints(m, delta, set)
	if err != nil {
		return nil, err
	}
	out = &Built{ChangedBackends: changed, Changed: set}
	if b.last != nil && len(changed) == 0 && b.cache.On() {
		out.Clusters, out.EncodedClusters, out.ClustersVersion = b.last.Clusters, b.last.EncodedClusters, b.last.ClustersVersion
		out.ClusterVersions, out.Assignments = b.last.ClusterVersions, b.assignments
	} else {
		b.assembleBackends(out)
		b.byNode = nil
	}
	switch patched, err := b.patchRoutes(out, endpoints); {
	case err != nil:
		return nil, err
	case patched:
	default:
		if err := b.assembleRoutes(out); err != nil {
			return nil, err
		}
	}
	b.last, b.seq = out, m.Seq
	return out, nil
}

// syncBackends rebuilds the parts of m's backends that changed, drops
// those of backends gone, and names both: those delta names, or every
// backend when delta is nil.
func (b *Builder) syncBackends(m *ir.DataPlane, delta *ir.Delta, set ChangeSet) (map[string]bool, error) {
	changed := map[string]bool{}
	var rebuild []ir.Backend
	var gone []*backendParts
	look := func(be ir.Backend) {
		// The entry holds its input, the backend's IR, which it is
		// compared with.
		if last, ok := b.backends.Get(be.Name, ""); ok && last.backend.Equal(be) {
			last.gen = b.gen
			return
		}
		rebuild = append(rebuild, be)
	}
	if delta == nil {
		for _, be := range m.Backends {
			look(be)
		}
	} else {
		for _, name := range delta.SortedBackends() {
			if be, ok := m.Backend(name); ok {
				look(be)
			} else if p := b.backends.Last(name); p != nil {
				gone = append(gone, p)
			}
		}
	}
	built, changes := make([]*backendParts, len(rebuild)), make([]changeList, len(rebuild))
	err := parallel.Each(len(rebuild), func(i int) (err error) {
		if built[i], err = b.buildBackend(rebuild[i]); err != nil {
			return err
		}
		// Compared here, in parallel: a full mTLS publish compares tens
		// of thousands of assignments with their last versions.
		changes[i] = backendChanges(b.lastBackend(rebuild[i].Name), built[i])
		return nil
	})
	if err != nil {
		return nil, err
	}
	n := 0
	for _, l := range changes {
		n += len(l.assignments)
	}
	set.reserve(KindAssignment, n)
	for i, p := range built {
		name := p.backend.Name
		set.addAll(changes[i])
		b.indexAssignments(b.lastBackend(name), p)
		b.backends.Put(name, "", p)
		changed[name] = true
	}
	drop := func(name string, p *backendParts) {
		set.addAll(backendChanges(p, nil))
		b.indexAssignments(p, nil)
		changed[name] = true
	}
	for _, p := range gone {
		drop(p.backend.Name, p)
		b.backends.Clear(p.backend.Name)
	}
	if delta == nil {
		cache.Sweep(b.cache, KindBackendParts, func(name string, p *backendParts) bool {
			if p.gen == b.gen {
				return true
			}
			drop(name, p)
			return false
		})
	}
	return changed, nil
}

// indexAssignments replaces in b.assignments a backend's assignments
// before its rebuild (nil: new) by those after (nil: gone).
func (b *Builder) indexAssignments(before, after *backendParts) {
	if after != nil {
		for _, a := range after.assignments {
			b.assignments[a.Name] = a
		}
	}
	if before != nil {
		for _, a := range before.assignments {
			if b.assignments[a.Name].Resource == a.Resource { // not one after has
				delete(b.assignments, a.Name)
			}
		}
	}
}

// syncEndpoints rebuilds the parts of m's endpoints that changed, drops
// those of endpoints gone, and reports whether any did either: those delta
// names, or every endpoint when delta is nil.
func (b *Builder) syncEndpoints(m *ir.DataPlane, delta *ir.Delta, set ChangeSet) (endpointSync, error) {
	var out endpointSync
	look := func(e ir.Endpoint) error {
		// As a backend's, the entry holds its input, the endpoint's IR.
		reuse, ok := b.endpoints.Get(e.Name, "")
		if ok && reuse.endpoint.Equal(e) {
			reuse.gen = b.gen
			return nil
		}
		p, err := buildEndpoint(e, reuse)
		if err != nil {
			return err
		}
		last := b.endpoints.Last(e.Name)
		endpointChanges(set, last, p)
		p.gen = b.gen
		b.endpoints.Put(e.Name, "", p)
		if last == nil {
			out.added = true
		} else {
			out.edited = append(out.edited, endpointEdit{before: last, after: p})
		}
		return nil
	}
	if delta == nil {
		for _, e := range m.Endpoints {
			if err := look(e); err != nil {
				return endpointSync{}, err
			}
		}
		cache.Sweep(b.cache, KindEndpointParts, func(_ string, p *endpointParts) bool {
			if p.gen == b.gen {
				return true
			}
			endpointChanges(set, p, nil)
			out.removed = true
			return false
		})
		return out, nil
	}
	for _, name := range delta.SortedEndpoints() {
		if e, ok := m.Endpoint(name); ok {
			if err := look(e); err != nil {
				return endpointSync{}, err
			}
		} else if p := b.endpoints.Last(name); p != nil {
			endpointChanges(set, p, nil)
			b.endpoints.Clear(name)
			out.removed = true
		}
	}
	return out, nil
}

// endpointSync is what syncEndpoints changed: endpoints added or removed,
// and those rebuilt, each with its parts before and after.
type endpointSync struct {
	added, removed bool
	edited         []endpointEdit
}

type endpointEdit struct{ before, after *endpointParts }

// endpointChanges adds to set what an endpoint's rebuild (before nil: new;
// after nil: gone) changed: its mesh routes and its scope (its public
// routes' configuration, which others share, is publicRoutes's to
// declare).
func endpointChanges(set ChangeSet, before, after *endpointParts) {
	switch {
	case before == nil || after == nil:
		for _, p := range []*endpointParts{before, after} {
			if p != nil {
				set.add(KindRoute, p.mesh.Name)
				set.add(KindScopedRoute, p.scope.GetName())
			}
		}
	default:
		if before.mesh.Version != after.mesh.Version {
			set.add(KindRoute, after.mesh.Name)
		}
		if before.encodedScope.Version != after.encodedScope.Version {
			set.add(KindScopedRoute, after.scope.GetName())
		}
	}
}

// buildBackend builds one backend's clusters and assignments with the
// builders Shared uses, on a model of that backend alone. It only reads
// the builder: syncBackends runs it for many backends at once.
func (b *Builder) buildBackend(be ir.Backend) (*backendParts, error) {
	one := &ir.DataPlane{Backends: []ir.Backend{be}}
	clusters, err := BuildClusters(one)
	if err != nil {
		return nil, err
	}
	p := &backendParts{gen: b.gen, backend: be, clusters: clusters}
	assignments := BuildAssignments(one)
	if b.mtls != nil && be.ViaInbound() {
		assignments = slices.Concat(assignments, inboundAssignments(one), nodeViewAssignments(one))
	}
	if p.assignments, err = encodeAssignments(assignments); err != nil {
		return nil, err
	}
	if b.mtls != nil {
		// The backends' entries are only read while backends build.
		if err := b.mtlsParts(p, b.lastBackend(be.Name)); err != nil {
			return nil, err
		}
	}
	if p.encoded, err = versionAll(p.clusters); err != nil {
		return nil, err
	}
	h := newKindHash()
	for _, c := range p.encoded {
		h.add(c.encoded.Name, c.encoded.Version)
	}
	p.hash = h.sum()
	return p, nil
}

// mtlsParts gives p, a backend's parts in an mTLS mesh, what its nodes'
// own parts read (ForNode): its clusters' TLS sockets, its
// configuration's hash and, reached through inbound listeners, the nodes
// it runs on with its count of replicas on each. A socket is last's (the
// backend's parts built last, nil if none) where what it depends on is
// the same.
func (b *Builder) mtlsParts(p, last *backendParts) error {
	be := p.backend
	var prior []*cluster.Cluster
	if last != nil && b.cache.On() {
		prior = last.clusters
	}
	if err := secureClusters(&ir.DataPlane{Backends: []ir.Backend{be}}, reusedSockets(b.mtls, prior), p.clusters); err != nil {
		return err
	}
	var err error
	if p.config, err = configHash(be); err != nil || !be.ViaInbound() {
		return err
	}
	p.perNode = map[string]int{}
	for _, r := range be.Replicas {
		if p.perNode[r.Node] == 0 {
			p.nodes = append(p.nodes, r.Node)
		}
		p.perNode[r.Node]++
	}
	return nil
}

// publicRoutesOf are e's routes on the public listener.
func publicRoutesOf(e ir.Endpoint) []*route.Route {
	return endpointRoutes(e, pathMatch(e.Route), public)
}

// buildEndpoint builds one endpoint's routes and scope; a part equal to
// the one in prev (the endpoint's last parts, or nil) is prev's, pointer
// and all, so its encoding is reused.
func buildEndpoint(e ir.Endpoint, prev *endpointParts) (*endpointParts, error) {
	p := &endpointParts{endpoint: e}
	mesh, scope := meshRoutes(e)
	var err error
	if p.mesh, err = encode(mesh.GetName(), mesh); err != nil {
		return nil, err
	}
	p.meshClusters = RouteClusters(mesh)
	if !e.Headless() {
		if p.publicHash, err = hashOf(publicRoutesOf(e)); err != nil {
			return nil, err
		}
	}
	p.scope = scope
	if p.encodedScope, err = encode(scope.GetName(), scope); err != nil {
		return nil, err
	}
	if prev != nil {
		if prev.mesh.Version == p.mesh.Version {
			p.mesh = prev.mesh
		}
		if prev.encodedScope.Version == p.encodedScope.Version {
			p.scope, p.encodedScope = prev.scope, prev.encodedScope
		}
	}
	return p, nil
}

// RouteClusters are the clusters a route configuration sends to: its
// routes' clusters, weighted clusters and mirrors, and the external
// pickers they ask, sorted.
func RouteClusters(rc *route.RouteConfiguration) []string {
	seen := map[string]bool{}
	for _, vh := range rc.GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			a := r.GetRoute()
			if c := a.GetCluster(); c != "" {
				seen[c] = true
			}
			if c := askedPicker(r.GetTypedPerFilterConfig()); c != "" {
				seen[c] = true
			}
			for _, wc := range a.GetWeightedClusters().GetClusters() {
				seen[wc.GetName()] = true
				if c := askedPicker(wc.GetTypedPerFilterConfig()); c != "" {
					seen[c] = true
				}
			}
			for _, m := range a.GetRequestMirrorPolicies() {
				seen[m.GetCluster()] = true
			}
		}
	}
	return sortedNames(seen)
}

// assembleBackends lists every backend's clusters and assignments, sorted
// by name, and versions the clusters.
func (b *Builder) assembleBackends(out *Built) {
	parts := cache.Sorted[*backendParts](b.cache, KindBackendParts)
	h := newKindHash()
	n := 0
	for _, p := range parts {
		n += len(p.Value.clusters)
	}
	out.ClusterVersions = make(map[string]string, n)
	out.Clusters, out.EncodedClusters = make([]*cluster.Cluster, 0, n), make([]Encoded, 0, n)
	for _, named := range parts {
		n, p := named.Name, named.Value
		out.Clusters = append(out.Clusters, p.clusters...)
		for _, c := range p.encoded {
			out.EncodedClusters = append(out.EncodedClusters, c.encoded)
		}
		h.add(n, p.hash)
		for _, c := range p.clusters {
			out.ClusterVersions[c.GetName()] = p.hash
		}
	}
	out.Assignments = b.assignments
	out.ClustersVersion = h.sum()
}

// assembleRoutes lists the endpoints' mesh routes and scopes from their
// parts, puts each public route configuration together from its
// endpoints' encoded routes (publicRoutes), in BuildRoutes's order, and
// versions them.
func (b *Builder) assembleRoutes(out *Built) error {
	parts := cache.Sorted[*endpointParts](b.cache, KindEndpointParts)
	out.Routes = make([]Encoded, 0, len(parts)+1)
	out.ScopedRoutes = make([]*route.ScopedRouteConfiguration, 0, len(parts)+1)
	out.EncodedScopes = make([]Encoded, 0, len(parts)+1)
	out.ScopeVersions = make(map[string]string, len(parts)+1)
	out.RouteClusters = make(map[string][]string, len(parts))
	all, scopes := newKindHash(), newKindHash()
	var routed []*endpointParts
	for _, named := range parts {
		n, p := named.Name, named.Value
		out.Routes = append(out.Routes, p.mesh)
		out.RouteClusters[p.mesh.Name] = p.meshClusters
		out.ScopedRoutes, out.EncodedScopes = append(out.ScopedRoutes, p.scope), append(out.EncodedScopes, p.encodedScope)
		out.ScopeVersions[p.scope.GetName()] = p.encodedScope.Version
		if p.publicHash != "" {
			routed = append(routed, p)
		}
		all.add(p.mesh.Name, p.mesh.Version)
		scopes.add(n, p.encodedScope.Version)
	}
	groups, err := b.publicRoutes(routed, out.Changed)
	if err != nil {
		return err
	}
	for _, key := range sortedNames(groups) { // "public/..." sorts after every "mesh/..."
		g := groups[key]
		out.Routes = append(out.Routes, g.table)
		out.ScopedRoutes, out.EncodedScopes = append(out.ScopedRoutes, g.scope), append(out.EncodedScopes, g.encodedScope)
		out.ScopeVersions[g.scope.GetName()] = g.encodedScope.Version
		all.add(g.table.Name, g.table.Version)
		scopes.add(g.scope.GetName(), g.encodedScope.Version)
	}
	out.RoutesVersion, out.ScopesVersion = all.sum(), scopes.sum()
	out.meshRoutes = len(parts)
	return nil
}

// publicGroup is one public route configuration, of the routed endpoints
// whose routes share a route key, and its scope.
type publicGroup struct {
	// members are the names of its endpoints, in its routes' order.
	members      []string
	table        Encoded
	scope        *route.ScopedRouteConfiguration
	encodedScope Encoded
}

// publicRoutes groups the routed endpoints' parts by route key into their
// public route configurations, reusing the last Build's of a group whose
// endpoints' public routes did not change, and adds to set those built
// anew or gone, with the scopes that came or went.
func (b *Builder) publicRoutes(routed []*endpointParts, set ChangeSet) (map[string]*publicGroup, error) {
	byKey := byRouteKey(routed, func(p *endpointParts) string { return p.endpoint.Route })
	out := make(map[string]*publicGroup, len(byKey))
	for key, members := range byKey {
		g, err := b.tableFor(key, members, set)
		if err != nil {
			return nil, err
		}
		out[key] = g
	}
	cache.Sweep(b.cache, KindRouteTable, func(key string, g *publicGroup) bool {
		if out[key] != nil {
			return true
		}
		set.add(KindRoute, g.table.Name)
		set.add(KindScopedRoute, g.scope.GetName())
		return false
	})
	return out, nil
}

// tableFor is route key's public table of members (its endpoints' parts,
// in its routes' order): the cache's if its members' public routes are
// those it was made from, else made anew and declared in set.
func (b *Builder) tableFor(key string, members []*endpointParts, set ChangeSet) (*publicGroup, error) {
	version := newKindHash()
	for _, p := range members {
		version.add(p.endpoint.Name, p.publicHash)
	}
	v := version.sum()
	if g, ok := b.tables.Get(key, v); ok {
		return g, nil
	}
	last := b.tables.Last(key)
	g, err := buildPublicGroup(key, v, members, last, b.cache.On())
	if err != nil {
		return nil, err
	}
	for _, p := range members {
		g.members = append(g.members, p.endpoint.Name)
	}
	if last == nil || last.table.Version != v {
		set.add(KindRoute, g.table.Name)
	}
	if last == nil {
		set.add(KindScopedRoute, g.scope.GetName())
	}
	b.tables.Put(key, v, g)
	return g, nil
}

// buildPublicGroup builds route key's public table of members, version
// v, with last's scope (the table's before, nil if none) if reuse.
func buildPublicGroup(key, v string, members []*endpointParts, last *publicGroup, reuse bool) (*publicGroup, error) {
	g := &publicGroup{}
	endpoints := make([]ir.Endpoint, len(members))
	for i, p := range members {
		endpoints[i] = p.endpoint
	}
	routes := modelListRoutes(endpoints)
	for _, e := range endpoints {
		routes = append(routes, publicRoutesOf(e)...)
	}
	// Versioned by its members' versions, known before it is encoded.
	var err error
	g.table, err = encodeVersioned(wire.PublicRouteName(key), publicRoutesConfig(key, routes), func([]byte) string { return v })
	if err != nil {
		return nil, err
	}
	if last != nil && reuse {
		g.scope, g.encodedScope = last.scope, last.encodedScope
		return g, nil
	}
	g.scope = publicScope(key)
	if g.encodedScope, err = encode(g.scope.GetName(), g.scope); err != nil {
		return nil, err
	}
	return g, nil
}

func sortedNames[T any](m map[string]T) []string {
	out := make([]string, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// kindHash makes a kind's version from its resources' names and
// versions.
type kindHash struct {
	h   hash.Hash
	buf []byte
}

func newKindHash() *kindHash { return &kindHash{h: sha256.New()} }

// add adds a resource's name and version.
func (k *kindHash) add(name, version string) {
	k.buf = append(append(append(append(k.buf[:0], name...), '='), version...), ';')
	k.h.Write(k.buf)
}

func (k *kindHash) sum() string { return hex.EncodeToString(k.h.Sum(nil))[:16] }

// hashOf hashes messages, in order, by their deterministic encoding.
func hashOf[T proto.Message](items []T) (string, error) {
	h := sha256.New()
	opts := proto.MarshalOptions{Deterministic: true}
	var buf []byte
	for _, item := range items {
		var err error
		buf, err = opts.MarshalAppend(buf[:0], item)
		if err != nil {
			return "", fmt.Errorf("hash resource: %w", err)
		}
		fmt.Fprintf(h, "%d:", len(buf))
		h.Write(buf)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

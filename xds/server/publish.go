package server

import (
	"context"
	"fmt"
	"iter"
	"maps"
	"slices"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/servemesh/servemesh/internal/parallel"
	"github.com/servemesh/servemesh/wire"
	"github.com/servemesh/servemesh/xds/translate"
)

// publish translates the current model and hands it to the caches: assignments
// that changed to the LinearCache first (so new clusters can warm), then one
// snapshot per node; assignments no longer built are removed only once
// every node has ACKed clusters that no longer ask for them
// (removeRetired), Envoy's make-before-break order. Translation is incremental
// (translate.Builder): only the backends and endpoints that changed since
// the last publish are rebuilt, and a node whose own resources did not
// change keeps them. When the model is the one last published and only
// nodes connected since, just their snapshots are built.
func (s *Server) publish(ctx context.Context) {
	start := time.Now()
	defer s.removeRetired()
	s.mu.Lock()
	s.forgetGoneNodes(start)
	m, gen, mtls := s.dataPlane, s.generation, s.mtls
	newOnly := s.built != nil && s.builtGen == gen && s.built.mtls == mtls
	nodes := make([]wire.ProxyNode, 0, len(s.nodes))
	for id, n := range s.nodes {
		if !newOnly || s.newNodes[id] {
			nodes = append(nodes, n.node)
		}
	}
	clear(s.newNodes)
	s.mu.Unlock()
	if m == nil {
		return // nothing accepted yet; nodes wait for the first model
	}
	if newOnly {
		own, errs := s.built.builder.ForNodes(nodes)
		s.setSnapshots(ctx, s.built, gen, nodes, own, errs)
		return
	}
	fresh := s.builder == nil || s.builder.MTLS() != mtls
	if fresh {
		var opts []translate.Option
		if s.cacheOff {
			opts = append(opts, translate.Uncached())
		}
		s.builder = translate.NewBuilder(mtls, opts...)
		s.encodings = newEncodings() // every cluster changes with the mesh's mTLS
	}
	shared, err := s.builder.Build(m)
	if err != nil { // ir.Lower validated it, so this is a bug
		s.log.Error("translating an accepted model failed", "generation", gen, "err", err)
		return
	}
	last := s.built
	if s.cacheOff { // nothing of the last publish's is reused: encodings, kinds, cuts, snapshots
		s.encodings, last = newEncodings(), nil
	}
	built, err := buildShared(mtls, shared, last, s.builder, s.encodings)
	if err != nil { // encoding what was just built: a bug
		s.log.Error("encoding an accepted model's resources failed", "generation", gen, "err", err)
		return
	}
	s.built, s.builtGen = built, gen
	built.keepNodes(nodes) // every node is published below

	// The nodes' own resources are built while the assignments go to
	// their cache: the one reads the build, the other the caches.
	var own []*translate.NodeBuilt
	var errs []error
	ownBuilt := make(chan struct{})
	go func() {
		defer close(ownBuilt)
		own, errs = built.builder.ForNodes(nodes)
	}()
	changed, removed := s.diffAssignments(shared, fresh)
	if len(changed) > 0 {
		if err := s.assignments.UpdateResources(changed, nil); err != nil {
			s.log.Error("updating assignments cache", "err", err)
		}
	}
	<-ownBuilt
	s.setSnapshots(ctx, built, gen, nodes, own, errs)
	s.retire(changed, removed, gen)
	s.metrics.publishes.Inc()
	s.metrics.publishTime.Observe(time.Since(start).Seconds())
	s.log.Debug("published", "generation", gen, "nodes", len(nodes), "backends_rebuilt", len(shared.ChangedBackends),
		"assignments_changed", len(changed), "assignments_removed", len(removed), "took", time.Since(start))
}

// setSnapshots builds each node's snapshot from built, the resources of
// model generation gen, and sets in the caches the kinds that changed for
// the node since it was last set (snapshotTypes: one cache per type).
func (s *Server) setSnapshots(ctx context.Context, built *sharedResources, gen uint64, nodes []wire.ProxyNode, own []*translate.NodeBuilt, errs []error) {
	built.prepare(nodes, own, errs)
	defer clear(built.prepared)
	for i, node := range nodes {
		s.mu.Lock()
		var asked demand
		if st := s.nodes[node.ID]; st != nil {
			asked = st.demandOf()
		}
		s.mu.Unlock()
		var snap snapshot
		err := errs[i]
		if err == nil {
			snap, err = built.snapshotFor(node, own[i], asked)
		}
		s.mu.Lock()
		st := s.nodes[node.ID]
		if st != nil && err != nil {
			st.refused = err.Error()
		}
		s.mu.Unlock()
		if err != nil {
			s.log.Error("node snapshot refused", "node", node.ID, "generation", gen, "err", err)
			continue
		}
		if st == nil {
			continue // forgotten since the publish began
		}
		if err := s.setKinds(ctx, node.ID, st.set, snap); err != nil {
			s.log.Error("setting node snapshot", "node", node.ID, "err", err)
			continue
		}
		s.mu.Lock()
		st.set = snap
		st.generation, st.refused = gen, ""
		s.mu.Unlock()
	}
}

// setKinds sets a node's kinds of next whose versions differ from last's
// (what the caches hold for it), in snapshotTypes' order: a change wakes
// only the streams of the types it changed, and go-control-plane compares
// the resources of only those types, per node. A traffic change sets
// routes alone, and only on the nodes that reach the endpoint.
func (s *Server) setKinds(ctx context.Context, node string, last, next snapshot) error {
	for _, typ := range snapshotTypes {
		if last != nil && last.GetVersion(typ) == next.GetVersion(typ) {
			continue
		}
		if err := s.snapshots[typ].SetSnapshot(ctx, node, snapshot{typ: next[typ]}); err != nil {
			return fmt.Errorf("%s: %w", typ, err)
		}
		if err := s.deltas[typ].set(ctx, node, next[typ]); err != nil {
			return fmt.Errorf("%s: %w", typ, err)
		}
	}
	return nil
}

// diffAssignments returns the assignments whose content changed since the
// last publish and the names that disappeared, as the build's change set
// declares them. After a fresh builder (the first build, or the mesh's
// mTLS changed), whose set knows nothing of what was published before,
// every assignment is compared with what was published.
func (s *Server) diffAssignments(built *translate.Built, fresh bool) (map[string]types.Resource, []string) {
	if !fresh && len(built.ChangedBackends) == 0 {
		return map[string]types.Resource{}, nil
	}
	// Sized for every name the build declares: a full mTLS publish
	// changes tens of thousands.
	changed := make(map[string]types.Resource, built.Changed.Len(translate.KindAssignment))
	next := built.Assignments
	var removed []string
	s.mu.Lock() // Serving reads publishedAssignments
	defer s.mu.Unlock()
	candidates := built.Changed.Of(translate.KindAssignment)
	if fresh {
		candidates = iterConcat(maps.Keys(next), slices.Values(slices.Collect(maps.Keys(s.publishedAssignments))))
	}
	for name := range candidates {
		cla, ok := next[name]
		switch {
		case !ok:
			if _, was := s.publishedAssignments[name]; was {
				removed = append(removed, name)
				delete(s.publishedAssignments, name)
			}
		case s.publishedAssignments[name] != cla.Version:
			changed[name] = cla.Resource
			s.publishedAssignments[name] = cla.Version
		}
	}
	return changed, removed
}

// iterConcat yields a's values, then b's.
func iterConcat[T any](a, b iter.Seq[T]) iter.Seq[T] {
	return func(yield func(T) bool) {
		for v := range a {
			if !yield(v) {
				return
			}
		}
		for v := range b {
			if !yield(v) {
				return
			}
		}
	}
}

// sharedResources are one publish's node-independent resources, and the
// builder that builds each node's own.
type sharedResources struct {
	mtls           *translate.MTLS
	builder        *translate.Builder
	enc            *encodings // the server's
	routes, scopes *kind
	clusters       *kind
	clusterList    []*cluster.Cluster // clusters, as translated
	// merged are the nodes' clusters with mTLS, by version (mergedFor).
	merged map[string]*kind
	// assignments are the build's, by name (read-only).
	assignments map[string]translate.Encoded
	// snaps are the nodes' last snapshots, by node, with what they were
	// built from.
	snaps map[string]*nodeSnapshot
	// reach are the kinds of the nodes that reach only some endpoints, by
	// reachKey; routeClusters, the clusters each mesh route configuration
	// sends to.
	reach         map[string]*reachKinds
	routeClusters map[string][]string
	// clusterRoutes are the mesh route configurations that send to each
	// cluster: routeClusters turned round, when a node first asks
	// (onDemand); onDemandCuts, the scopes kinds made on demand, by the
	// kind they were made from (onDemandScopes).
	clusterRoutes map[string][]string
	onDemandCuts  map[*kind]*kind
	// prepared are the kinds prepare built, by node, for snapshotFor.
	prepared map[string]preparedKinds
	// sharedChecked says sharedConsistent ran, sharedErr what it found.
	sharedChecked bool
	sharedErr     error
	// meshOnly are scopes without the public ones, for the nodes without
	// a public listener, cut from scopes when first asked.
	meshOnly, meshOnlyFrom *kind
}

// meshScopes are the mesh's scopes alone, cut again only when the scopes
// changed.
func (sr *sharedResources) meshScopes() *kind {
	if sr.meshOnlyFrom != sr.scopes {
		sr.meshOnly, sr.meshOnlyFrom = sr.scopes.subset(sr.scopes.meshNames()), sr.scopes
	}
	return sr.meshOnly
}

// nodeSnapshot is what a node's last snapshot was built from, and its own
// kinds.
type nodeSnapshot struct {
	listenersVer, ownVer, sharedClusters string
	listeners, clusters                  *kind
}

// buildShared turns a build into what snapshots take, reusing the last
// publish's kinds whose version did not change, and the encodings of the
// resources that did not.
func buildShared(mtls *translate.MTLS, r *translate.Built, last *sharedResources, b *translate.Builder, enc *encodings) (*sharedResources, error) {
	out := &sharedResources{mtls: mtls, builder: b, enc: enc, snaps: map[string]*nodeSnapshot{}, reach: map[string]*reachKinds{}}
	if last != nil {
		out.reach = last.reach // each cut is made again if what it was cut from changed
		out.meshOnly, out.meshOnlyFrom = last.meshOnly, last.meshOnlyFrom
	}
	sameMTLS := last != nil && last.mtls == mtls
	var prevClusters, prevRoutes, prevScopes *kind
	if sameMTLS {
		out.snaps, prevClusters = last.snaps, last.clusters
	}
	shared := func(typ string, n int) *kindEncoder { return enc.begin(typ, n) }
	if last != nil {
		prevRoutes, prevScopes = last.routes, last.scopes
	}
	var err error
	// The encodings of what the build changed are stale: drop them (a
	// resource keeps its encoding while its version holds).
	enc.invalidate(resource.ScopedRouteType, r.Changed.Names(translate.KindScopedRoute))
	if prevClusters != nil && prevClusters.version == r.ClustersVersion {
		out.clusters, out.clusterList = last.clusters, last.clusterList
	} else {
		// The builder encoded each cluster as it built it.
		out.clusters, out.clusterList = clustersKind(r), r.Clusters
	}
	if prevRoutes != nil && prevRoutes.version == r.RoutesVersion {
		out.routes = prevRoutes
	} else {
		out.routes = encodedKind(r.RoutesVersion, r.Routes)
	}
	out.routeClusters = r.RouteClusters
	if prevScopes != nil && prevScopes.version == r.ScopesVersion {
		out.scopes = prevScopes
	} else if out.scopes, err = newKind(r.ScopesVersion, r.ScopedRoutes, lookup(r.ScopeVersions), shared(resource.ScopedRouteType, len(r.ScopedRoutes))); err != nil {
		return nil, err
	}
	out.assignments = r.Assignments
	return out, nil
}

// clustersKind lists a build's shared clusters as the builder encoded
// them, under their versions.
func clustersKind(r *translate.Built) *kind {
	k := &kind{version: r.ClustersVersion, twins: make(map[string]types.Resource, len(r.Clusters)),
		versions: make(map[string]string, len(r.Clusters)), sources: make(map[string]types.Resource, len(r.Clusters))}
	for i, c := range r.Clusters {
		name := c.GetName()
		k.twins[name], k.versions[name], k.sources[name] = r.EncodedClusters[i].Resource, r.ClusterVersions[name], c
	}
	return k
}

// builtKind lists resources the builder encoded (encoded[i] is
// items[i]'s encoding, with its version) under version: a node's
// listeners.
func builtKind[T types.Resource](version string, items []T, encoded []translate.Encoded) *kind {
	k := &kind{version: version, twins: make(map[string]types.Resource, len(items)),
		versions: make(map[string]string, len(items)), sources: make(map[string]types.Resource, len(items))}
	for i, x := range items {
		e := encoded[i]
		k.twins[e.Name], k.versions[e.Name], k.sources[e.Name] = e.Resource, e.Version, x
	}
	return k
}

// keepNodes forgets what was built for nodes other than nodes: their
// own resources, last snapshots, and the cuts of reaches no node has.
func (sr *sharedResources) keepNodes(nodes []wire.ProxyNode) {
	known := make(map[string]bool, len(nodes))
	reaches := map[string]bool{}
	for _, n := range nodes {
		known[n.ID] = true
		if n.Reachable != nil {
			reaches[reachKey(n)] = true
		}
	}
	sr.builder.KeepNodes(known)
	for id := range sr.snaps {
		if !known[id] {
			delete(sr.snaps, id)
		}
	}
	for key := range sr.reach {
		if !reaches[key] {
			delete(sr.reach, key)
		}
	}
}

func lookup(versions map[string]string) func(string) string {
	return func(name string) string { return versions[name] }
}

// snapshotFor builds a node's snapshot of listeners, routes, scoped routes
// and clusters from its own resources (Builder.ForNodes builds every
// node's at once, in parallel); asked is what it asked for, if its
// clusters come on demand. A node whose listeners and clusters are what they were at
// its last snapshot only gets the new routes; otherwise the snapshot is
// first checked to be consistent with the assignments (every cluster has
// its assignment, every listener its routes).
func (sr *sharedResources) snapshotFor(node wire.ProxyNode, own *translate.NodeBuilt, asked demand) (snapshot, error) {
	var err error
	routes, scopes, clusters := sr.routes, sr.scopes, sr.clusters
	switch {
	case node.Reachable != nil:
		rk := sr.reachFor(node)
		routes, scopes, clusters = rk.routes, rk.scopes, rk.clusters
	case !node.Public():
		// Scopes are sent to every node that asks for any (Envoy asks for
		// all): a node without a public listener gets the mesh's alone, or
		// it would ask for the public route configurations they name.
		scopes = sr.meshScopes()
	}
	if node.ClustersOnDemand {
		clusters = sr.onDemand(clusters, asked.clusters)
		if !node.Public() {
			if scopes, err = sr.onDemandScopes(scopes); err != nil {
				return nil, err
			}
			routes = routes.subset(asked.routes)
		}
	}
	last := sr.snaps[node.ID]
	if last.outdated(own, clusters) {
		p, ok := sr.prepared[node.ID]
		if !ok || p.routes != routes || p.clusters != clusters {
			p.kinds, p.err = sr.nodeKinds(node.ID, own, routes, clusters)
		}
		if last, err = p.kinds, p.err; err != nil {
			return nil, err
		}
	}
	snap := snapshot{
		resource.ListenerType:    last.listeners,
		resource.RouteType:       routes,
		resource.ScopedRouteType: scopes,
		resource.ClusterType:     last.clusters,
	}
	sr.snaps[node.ID] = last
	return snap, nil
}

// outdated reports whether a node's last kinds (nil: none) are not those
// of its own resources and the shared clusters it gets.
func (last *nodeSnapshot) outdated(own *translate.NodeBuilt, clusters *kind) bool {
	return last == nil || last.listenersVer != own.ListenersVersion || last.ownVer != own.ClustersVersion || last.sharedClusters != clusters.version
}

// preparedKinds are a node's kinds as prepare built them, from routes and
// clusters.
type preparedKinds struct {
	routes, clusters *kind
	kinds            *nodeSnapshot
	err              error
}

// prepare builds, on every core, the kinds (nodeKinds) of the nodes whose
// snapshots take the publish's routes and clusters whole (neither cut to
// what they reach nor on demand: most nodes) and whose own resources or
// shared clusters changed since their last: checking a node's listeners
// and merging its clusters with the shared ones, one node after the
// other, was a tenth of a full mTLS publish of 30 nodes. The merged
// clusters are made first, one per distinct version of the nodes' own
// (mergedFor's cache, which the nodes then only read); snapshotFor takes
// what prepare built.
func (sr *sharedResources) prepare(nodes []wire.ProxyNode, own []*translate.NodeBuilt, errs []error) {
	var todo []int
	merge := map[string]*translate.NodeBuilt{}
	for i, n := range nodes {
		if errs[i] != nil || n.Reachable != nil || n.ClustersOnDemand || !sr.snaps[n.ID].outdated(own[i], sr.clusters) {
			continue
		}
		todo = append(todo, i)
		if key := mergedKey(sr.clusters, own[i]); len(own[i].Clusters) > 0 && sr.merged[key] == nil {
			merge[key] = own[i]
		}
	}
	if len(todo) == 0 {
		return
	}
	_ = sr.sharedConsistent() // once, here, not in parallel; each node's nodeKinds reports it
	keys := slices.Collect(maps.Keys(merge))
	merged := make([]*kind, len(keys))
	_ = parallel.Each(len(keys), func(k int) error {
		merged[k] = mergedClusters(sr.clusters, merge[keys[k]])
		return nil
	})
	if sr.merged == nil {
		sr.merged = map[string]*kind{}
	}
	for k, key := range keys {
		sr.merged[key] = merged[k]
	}
	kinds := make([]preparedKinds, len(todo))
	_ = parallel.Each(len(todo), func(k int) error {
		i := todo[k]
		p := preparedKinds{routes: sr.routes, clusters: sr.clusters}
		p.kinds, p.err = sr.nodeKinds(nodes[i].ID, own[i], sr.routes, sr.clusters)
		kinds[k] = p
		return nil
	})
	if sr.prepared == nil {
		sr.prepared = make(map[string]preparedKinds, len(todo))
	}
	for k, i := range todo {
		sr.prepared[nodes[i].ID] = kinds[k]
	}
}

// nodeKinds builds a node's listeners and clusters (clusters: the shared
// ones it gets, with its own) once they are checked consistent with the
// assignments and routes, encoding its own through the server's cache.
func (sr *sharedResources) nodeKinds(node string, own *translate.NodeBuilt, routes, clusters *kind) (*nodeSnapshot, error) {
	// The shared clusters a node gets are the publish's or a cut of them,
	// checked once a publish; its own clusters, as ForNodes built them;
	// its listeners, here.
	if err := sr.sharedConsistent(); err != nil {
		return nil, err
	}
	if err := sr.listenersConsistent(own.Listeners, routes); err != nil {
		return nil, err
	}
	next := &nodeSnapshot{listenersVer: own.ListenersVersion, ownVer: own.ClustersVersion, sharedClusters: clusters.version, clusters: clusters,
		listeners: builtKind(own.ListenersVersion, own.Listeners, own.EncodedListeners)}
	if len(own.Clusters) > 0 {
		next.clusters = sr.mergedFor(clusters, own)
	}
	return next, nil
}

// mergedFor is mergedClusters(shared, own), made once a publish for every
// node whose own clusters are these (by their version): nodes that run no
// replica have the same, and a thousand of them held a copy each of the
// mesh's clusters (and their streams each a map of its versions, which a
// shared kind's streams share: deltacache.go).
func (sr *sharedResources) mergedFor(shared *kind, own *translate.NodeBuilt) *kind {
	key := mergedKey(shared, own)
	if k := sr.merged[key]; k != nil {
		return k
	}
	if sr.merged == nil {
		sr.merged = map[string]*kind{}
	}
	k := mergedClusters(shared, own)
	sr.merged[key] = k
	return k
}

// mergedKey is the version of mergedClusters(shared, own), by which
// mergedFor keeps it.
func mergedKey(shared *kind, own *translate.NodeBuilt) string {
	return shared.version + "-" + own.ClustersVersion
}

// mergedClusters is a node's clusters with mTLS: the shared ones, and the
// node's own, which replace shared ones of the same name, each as the
// builder versioned and encoded it. It lies over shared (kind.under):
// nothing of shared is copied.
func mergedClusters(shared *kind, own *translate.NodeBuilt) *kind {
	k := &kind{version: mergedKey(shared, own), under: shared, versions: make(map[string]string, len(own.Clusters)),
		twins: make(map[string]types.Resource, len(own.Clusters)), sources: make(map[string]types.Resource, len(own.Clusters))}
	for i, c := range own.Clusters {
		e := own.EncodedClusters[i]
		k.twins[e.Name], k.versions[e.Name], k.sources[e.Name] = e.Resource, e.Version, c
		if _, ok := shared.versionOf(e.Name); ok {
			k.hidden++
		}
	}
	return k
}

// sharedConsistent checks, once a publish, that every shared EDS cluster
// has its assignment.
func (sr *sharedResources) sharedConsistent() error {
	if !sr.sharedChecked {
		sr.sharedErr, sr.sharedChecked = translate.AskedAreBuilt(sr.clusterList, sr.assignments), true
	}
	return sr.sharedErr
}

// listenersConsistent checks, as the snapshot cache's Consistent does,
// that every route configuration a listener names by RDS is in routes
// (those of the mesh's scopes are built with them).
func (sr *sharedResources) listenersConsistent(listeners []*listener.Listener, routes *kind) error {
	named := make(map[string]types.ResourceWithTTL, len(listeners))
	for _, l := range listeners {
		if l.GetName() == wire.InboundListener {
			// Its chains, one per backend the node runs, carry their
			// routes inline (translate's TestInboundRoutesAreInline):
			// reading each one's connection manager back named nothing
			// and cost a tenth of a full mTLS publish.
			continue
		}
		named[l.GetName()] = types.ResourceWithTTL{Resource: l}
	}
	for name := range cachev3.GetResourceReferences(named)[resource.RouteType] {
		if routes.twin(name) == nil {
			return fmt.Errorf("snapshot is inconsistent: a listener names route configuration %q, which is not built", name)
		}
	}
	return nil
}

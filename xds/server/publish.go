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
	"github.com/servemesh/servemesh/xds/cache"
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
	s.taken = gen
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
		// Every cluster changes with the mesh's mTLS: the new builder
		// forgets its parts, and the server its kinds.
		s.builder = translate.NewBuilder(mtls, translate.WithCache(s.cache))
		s.cache.Clear(KindSnapshotKinds)
	}
	// Every node is published below: the kinds no node takes are dropped
	// after (DropUnused), and the builder forgets the nodes gone.
	s.cache.NextEpoch()
	defer s.cache.DropUnused(KindSnapshotKinds)
	shared, err := s.builder.Build(m)
	if err != nil { // ir.Lower validated it, so this is a bug
		s.log.Error("translating an accepted model failed", "generation", gen, "err", err)
		return
	}
	built := buildShared(mtls, shared, s.builder, s.cache)
	s.built, s.builtGen = built, gen
	s.builder.KeepNodes(nodeIDs(nodes))

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
	prepared := built.prepare(nodes, own, errs)
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
			snap, err = built.snapshotFor(node, own[i], asked, prepared[i])
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

// nodeIDs are the ids of nodes, as a set.
func nodeIDs(nodes []wire.ProxyNode) map[string]bool {
	out := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		out[n.ID] = true
	}
	return out
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

// KindSnapshotKinds is the kind of the server's entries in the one cache
// (xds/cache): the kinds (kind) it makes of a build's resources, which
// nodes' snapshots share: the shared routes, scopes and clusters, the cuts
// of them for nodes that reach some endpoints, have no public listener or
// load routes on demand, each node's listeners, and the nodes' clusters
// merged over the shared ones. Each is keyed by what it is made from (its
// name) and that input's version, so a change makes again only the kinds
// whose inputs it changed; a publish to every node drops those it no
// longer used (cache.DropUnused).
const KindSnapshotKinds = "server/kind"

// sharedResources are one publish's node-independent resources, and the
// builder that builds each node's own.
type sharedResources struct {
	mtls           *translate.MTLS
	builder        *translate.Builder
	kinds          cache.Of[*kind] // the server's entries (KindSnapshotKinds) in its cache
	routes, scopes *kind
	clusters       *kind
	clusterList    []*cluster.Cluster // clusters, as translated
	// assignments are the build's, by name (read-only).
	assignments map[string]translate.Encoded
	// routeClusters are the clusters each mesh route configuration sends
	// to.
	routeClusters map[string][]string
	// clusterRoutes are the mesh route configurations that send to each
	// cluster: routeClusters turned round, when a node first asks
	// (onDemand).
	clusterRoutes map[string][]string
	// clustersBuilt says the shared clusters' kind was made by this
	// publish (its cache entry missed), sharedChecked that
	// sharedConsistent ran, sharedErr what it found.
	clustersBuilt, sharedChecked bool
	sharedErr                    error
}

// kindOf is the server's kind name made from an input of version, made
// by make if the cache has none.
func (sr *sharedResources) kindOf(name, version string, make func() (*kind, error)) (*kind, error) {
	if k, ok := sr.kinds.Get(name, version); ok {
		return k, nil
	}
	k, err := make()
	if err != nil {
		return nil, err
	}
	sr.kinds.Put(name, version, k)
	return k, nil
}

// cut is kindOf for a kind that cannot fail to be made.
func (sr *sharedResources) cut(name, version string, make func() *kind) *kind {
	k, _ := sr.kindOf(name, version, func() (*kind, error) { return make(), nil })
	return k
}

// meshScopes are the mesh's scopes alone, cut again only when the scopes
// changed.
func (sr *sharedResources) meshScopes() *kind {
	return sr.cut("mesh-scopes", sr.scopes.version, func() *kind { return sr.scopes.subset(sr.scopes.meshNames()) })
}

// buildShared turns a build into what snapshots take: the shared kinds,
// each made again only when its version changed.
func buildShared(mtls *translate.MTLS, r *translate.Built, b *translate.Builder, c *cache.Cache) *sharedResources {
	out := &sharedResources{mtls: mtls, builder: b, kinds: cache.KindOf[*kind](c, KindSnapshotKinds), assignments: r.Assignments, routeClusters: r.RouteClusters}
	out.clusters = out.cut("shared/clusters", r.ClustersVersion, func() *kind {
		out.clustersBuilt = true
		return clustersKind(r)
	})
	out.clusterList = out.clusters.clusterList
	out.routes = out.cut("shared/routes", r.RoutesVersion, func() *kind { return encodedKind(r.RoutesVersion, r.Routes) })
	out.scopes = out.cut("shared/scopes", r.ScopesVersion, func() *kind { return builtKind(r.ScopesVersion, r.ScopedRoutes, r.EncodedScopes) })
	return out
}

// clustersKind lists a build's shared clusters as the builder encoded
// them, under their versions.
func clustersKind(r *translate.Built) *kind {
	k := &kind{version: r.ClustersVersion, twins: make(map[string]types.Resource, len(r.Clusters)),
		versions: make(map[string]string, len(r.Clusters)), sources: make(map[string]types.Resource, len(r.Clusters)),
		clusterList: r.Clusters}
	for i, c := range r.Clusters {
		name := c.GetName()
		k.twins[name], k.versions[name], k.sources[name] = r.EncodedClusters[i].Resource, r.ClusterVersions[name], c
	}
	return k
}

// builtKind lists resources the builder encoded (encoded[i] is
// items[i]'s encoding, with its version) under version: a node's
// listeners, the shared scopes.
func builtKind[T types.Resource](version string, items []T, encoded []translate.Encoded) *kind {
	k := &kind{version: version, twins: make(map[string]types.Resource, len(items)),
		versions: make(map[string]string, len(items)), sources: make(map[string]types.Resource, len(items))}
	for i, x := range items {
		e := encoded[i]
		k.twins[e.Name], k.versions[e.Name], k.sources[e.Name] = e.Resource, e.Version, x
	}
	return k
}

// snapshotFor builds a node's snapshot of listeners, routes, scoped routes
// and clusters from its own resources (Builder.ForNodes builds every
// node's at once, in parallel); asked is what it asked for, if its
// clusters come on demand; pre, what prepare made for it (nil: nothing).
// A node's listeners are checked consistent with its routes (every
// listener has its routes) when they are made, and the shared clusters
// with the assignments (every cluster has its assignment) when they are.
func (sr *sharedResources) snapshotFor(node wire.ProxyNode, own *translate.NodeBuilt, asked demand, pre *nodeKinds) (snapshot, error) {
	var err error
	routes, scopes, clusters := sr.routes, sr.scopes, sr.clusters
	switch {
	case node.Reachable != nil:
		routes, scopes, clusters = sr.reachFor(node)
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
	if pre == nil || pre.routes != routes || pre.clusters != clusters {
		pre = &nodeKinds{routes: routes, clusters: clusters}
		pre.listeners, pre.merged, pre.err = sr.nodeKinds(node.ID, own, routes, clusters)
	}
	if pre.err != nil {
		return nil, pre.err
	}
	return snapshot{
		resource.ListenerType:    pre.listeners,
		resource.RouteType:       routes,
		resource.ScopedRouteType: scopes,
		resource.ClusterType:     pre.merged,
	}, nil
}

// nodeKinds are a node's listeners and clusters as prepare made them,
// from routes and clusters.
type nodeKinds struct {
	routes, clusters  *kind
	listeners, merged *kind
	err               error
}

// prepare makes, on every core, the kinds (nodeKinds) of the nodes whose
// snapshots take the publish's routes and clusters whole (neither cut to
// what they reach nor on demand: most nodes): checking a node's listeners
// and merging its clusters with the shared ones, one node after the
// other, was a tenth of a full mTLS publish of 30 nodes. The merged
// clusters are made first, one per distinct version of the nodes' own,
// which the nodes then only read. snapshotFor takes each node's at its
// index (nil: not prepared).
func (sr *sharedResources) prepare(nodes []wire.ProxyNode, own []*translate.NodeBuilt, errs []error) []*nodeKinds {
	out := make([]*nodeKinds, len(nodes))
	var todo []int
	merge := map[string]*translate.NodeBuilt{}
	for i, n := range nodes {
		if errs[i] != nil || n.Reachable != nil || n.ClustersOnDemand {
			continue
		}
		todo = append(todo, i)
		if len(own[i].Clusters) > 0 {
			merge[mergedKey(sr.clusters, own[i])] = own[i]
		}
	}
	if len(todo) == 0 {
		return out
	}
	_ = sr.sharedConsistent() // once, here, not in parallel; each node's nodeKinds reports it
	keys := slices.Collect(maps.Keys(merge))
	_ = parallel.Each(len(keys), func(k int) error {
		sr.mergedFor(sr.clusters, merge[keys[k]])
		return nil
	})
	_ = parallel.Each(len(todo), func(k int) error {
		i := todo[k]
		p := &nodeKinds{routes: sr.routes, clusters: sr.clusters}
		p.listeners, p.merged, p.err = sr.nodeKinds(nodes[i].ID, own[i], sr.routes, sr.clusters)
		out[i] = p
		return nil
	})
	return out
}

// nodeKinds makes a node's listeners and clusters (clusters: the shared
// ones it gets, with its own), checked consistent with routes and the
// assignments.
func (sr *sharedResources) nodeKinds(node string, own *translate.NodeBuilt, routes, clusters *kind) (listeners, merged *kind, err error) {
	if err := sr.sharedConsistent(); err != nil {
		return nil, nil, err
	}
	// Checked against routes when made: what a listener names by RDS
	// changes with the listener (the mesh's and public routes come by
	// scopes, which name route configurations of their own).
	listeners, err = sr.kindOf("listeners/"+node, own.ListenersVersion, func() (*kind, error) {
		if err := sr.listenersConsistent(own.Listeners, routes); err != nil {
			return nil, err
		}
		return builtKind(own.ListenersVersion, own.Listeners, own.EncodedListeners), nil
	})
	if err != nil {
		return nil, nil, err
	}
	if len(own.Clusters) == 0 {
		return listeners, clusters, nil
	}
	return listeners, sr.mergedFor(clusters, own), nil
}

// mergedFor is mergedClusters(shared, own), made once for every node
// whose own clusters are these (by their version): nodes that run no
// replica have the same, and a thousand of them held a copy each of the
// mesh's clusters (and their streams each a map of its versions, which a
// shared kind's streams share: deltacache.go).
func (sr *sharedResources) mergedFor(shared *kind, own *translate.NodeBuilt) *kind {
	return sr.cut("merged/"+mergedKey(shared, own), "", func() *kind { return mergedClusters(shared, own) })
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

// sharedConsistent checks, once a publish that made the shared clusters
// anew, that every shared EDS cluster has its assignment; their kind is
// dropped if not, so the next publish checks again. Not safe for
// concurrent use: prepare calls it before its goroutines.
func (sr *sharedResources) sharedConsistent() error {
	if sr.sharedChecked {
		return sr.sharedErr
	}
	if sr.clustersBuilt {
		sr.sharedErr = translate.AskedAreBuilt(sr.clusterList, sr.assignments)
		if sr.sharedErr != nil {
			sr.kinds.Clear("shared/clusters")
		}
	}
	sr.sharedChecked = true
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

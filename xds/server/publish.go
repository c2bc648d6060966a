package server

import (
	"context"
	"fmt"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/servemesh/servemesh/wire"
	"github.com/servemesh/servemesh/xds/translate"
)

// publish translates the current model and hands it to the caches: assignments
// that changed to the LinearCache first (so new clusters can warm), then one
// snapshot per node, then endpoint removals. Translation is incremental
// (translate.Builder): only the backends and endpoints that changed since
// the last publish are rebuilt, and a node whose own resources did not
// change keeps them. When the model is the one last published and only
// nodes connected since, just their snapshots are built.
func (s *Server) publish(ctx context.Context) {
	start := time.Now()
	s.mu.Lock()
	s.forgetGoneNodes(start)
	m, gen, mtls := s.model, s.generation, s.mtls
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
		s.setSnapshots(ctx, s.built, gen, nodes)
		return
	}
	if s.builder == nil || s.builder.MTLS() != mtls {
		s.builder = translate.NewBuilder(mtls)
	}
	shared, err := s.builder.Build(m)
	if err != nil { // SetModel validated it, so this is a bug
		s.log.Error("translating an accepted model failed", "generation", gen, "err", err)
		return
	}
	built := buildShared(mtls, shared, s.built, s.builder)
	s.built, s.builtGen = built, gen
	known := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		known[n.ID] = true
	}
	s.builder.KeepNodes(known) // every node is published below
	for id := range built.snaps {
		if !known[id] {
			delete(built.snaps, id)
		}
	}

	changed, removed := s.diffAssignments(shared)
	if len(changed) > 0 {
		if err := s.assignments.UpdateResources(changed, nil); err != nil {
			s.log.Error("updating assignments cache", "err", err)
		}
	}
	s.setSnapshots(ctx, built, gen, nodes)
	if len(removed) > 0 {
		if err := s.assignments.UpdateResources(nil, removed); err != nil {
			s.log.Error("removing assignments from cache", "err", err)
		}
	}
	s.metrics.publishes.Inc()
	s.metrics.publishTime.Observe(time.Since(start).Seconds())
	s.log.Debug("published", "generation", gen, "nodes", len(nodes), "backends_rebuilt", len(shared.ChangedBackends),
		"assignments_changed", len(changed), "assignments_removed", len(removed), "took", time.Since(start))
}

// setSnapshots builds and sets each node's snapshot from built, the
// resources of model generation gen.
func (s *Server) setSnapshots(ctx context.Context, built *sharedResources, gen uint64, nodes []wire.ProxyNode) {
	for _, node := range nodes {
		snap, err := built.snapshotFor(node)
		if err != nil {
			s.log.Error("node snapshot refused", "node", node.ID, "generation", gen, "err", err)
			s.mu.Lock()
			if st := s.nodes[node.ID]; st != nil {
				st.refused = err.Error()
			}
			s.mu.Unlock()
			continue
		}
		if err := s.snapshots.SetSnapshot(ctx, node.ID, snap); err != nil {
			s.log.Error("setting node snapshot", "node", node.ID, "err", err)
			continue
		}
		s.mu.Lock()
		if st := s.nodes[node.ID]; st != nil {
			st.generation, st.refused = gen, ""
			st.expected = map[string]string{
				resource.ListenerType: snap.GetVersion(resource.ListenerType),
				resource.RouteType:    snap.GetVersion(resource.RouteType),
				resource.ClusterType:  snap.GetVersion(resource.ClusterType),
			}
		}
		s.mu.Unlock()
	}
}

// diffAssignments returns the assignments whose content changed since the last
// publish and the names that disappeared, and records the new set. Only
// the assignments of the backends the build rebuilt can have changed.
func (s *Server) diffAssignments(built *translate.Built) (map[string]types.Resource, []string) {
	changed := map[string]types.Resource{}
	if len(built.ChangedBackends) == 0 {
		return changed, nil
	}
	next := make(map[string]types.Resource, len(built.Assignments))
	for _, cla := range built.Assignments {
		name := cla.GetClusterName()
		next[name] = cla
		if old, ok := s.publishedAssignments[name]; !ok || (old != cla && !proto.Equal(old, cla)) {
			changed[name] = cla
		}
	}
	var removed []string
	for name := range s.publishedAssignments {
		if _, ok := next[name]; !ok {
			removed = append(removed, name)
		}
	}
	s.publishedAssignments = next
	return changed, removed
}

// sharedResources are one publish's node-independent resources, and the
// builder that builds each node's own.
type sharedResources struct {
	mtls                   *translate.MTLS
	builder                *translate.Builder
	routes, clusters       []types.Resource
	clusterList            []*cluster.Cluster // clusters, as translated
	routesVer, clustersVer string
	assignmentNames        map[string]bool
	// snaps are the nodes' last snapshots, by node, with what they were
	// built from.
	snaps map[string]*nodeSnapshot
}

// nodeSnapshot is a node's last snapshot and the versions it holds.
type nodeSnapshot struct {
	snap                                 *cachev3.Snapshot
	listenersVer, ownVer, sharedClusters string
	merged                               []types.Resource
}

// buildShared turns a build into what snapshots take, reusing the last
// publish's lists of a kind whose version did not change.
func buildShared(mtls *translate.MTLS, r *translate.Built, last *sharedResources, b *translate.Builder) *sharedResources {
	out := &sharedResources{mtls: mtls, builder: b, routesVer: r.RoutesVersion, clustersVer: r.ClustersVersion, snaps: map[string]*nodeSnapshot{}}
	if last != nil && last.mtls == mtls {
		out.snaps = last.snaps
	}
	if last != nil && last.mtls == mtls && last.clustersVer == r.ClustersVersion {
		out.clusters, out.clusterList = last.clusters, last.clusterList
	} else {
		out.clusters, out.clusterList = asResources(r.Clusters), r.Clusters
	}
	if last != nil && last.routesVer == r.RoutesVersion {
		out.routes = last.routes
	} else {
		out.routes = asResources(r.Routes)
	}
	if last != nil && last.mtls == mtls && len(r.ChangedBackends) == 0 {
		out.assignmentNames = last.assignmentNames
	} else {
		out.assignmentNames = make(map[string]bool, len(r.Assignments))
		for _, x := range r.Assignments {
			out.assignmentNames[x.GetClusterName()] = true
		}
	}
	return out
}

// snapshotFor builds a node's snapshot of listeners, routes and clusters,
// each type versioned by a hash of its content. A node whose listeners and
// clusters are what they were at its last snapshot only gets the new
// routes; otherwise the snapshot is first checked to be consistent with
// the assignments (every cluster has its assignment, every listener its
// route configuration).
func (sr *sharedResources) snapshotFor(node wire.ProxyNode) (*cachev3.Snapshot, error) {
	own, err := sr.builder.ForNode(node)
	if err != nil {
		return nil, err
	}
	last := sr.snaps[node.ID]
	listeners := asResources(own.Listeners)
	if last == nil || last.listenersVer != own.ListenersVersion || last.ownVer != own.ClustersVersion || last.sharedClusters != sr.clustersVer {
		merged := sr.clusterList
		if len(own.Clusters) > 0 { // mTLS: the node's own, replacing shared ones of the same name
			merged = translate.MergeClusters(sr.clusterList, own.Clusters)
		}
		if err := sr.consistent(listeners, merged); err != nil {
			return nil, err
		}
		last = &nodeSnapshot{listenersVer: own.ListenersVersion, ownVer: own.ClustersVersion, sharedClusters: sr.clustersVer, merged: asResources(merged)}
		if len(own.Clusters) == 0 {
			last.merged = sr.clusters
		}
	}
	clustersVer := sr.clustersVer
	if len(own.Clusters) > 0 {
		clustersVer += "-" + own.ClustersVersion
	}
	snap, err := cachev3.NewSnapshot("", map[resource.Type][]types.Resource{
		resource.ListenerType: listeners,
		resource.RouteType:    sr.routes,
		resource.ClusterType:  last.merged,
	})
	if err != nil {
		return nil, fmt.Errorf("build snapshot: %w", err)
	}
	snap.Resources[types.Listener].Version = own.ListenersVersion
	snap.Resources[types.Route].Version = sr.routesVer
	snap.Resources[types.Cluster].Version = clustersVer
	last.snap = snap
	sr.snaps[node.ID] = last
	return snap, nil
}

// consistent checks, as the snapshot cache's Consistent does, that every
// EDS cluster has its assignment and every listener its routes.
func (sr *sharedResources) consistent(listeners []types.Resource, clusters []*cluster.Cluster) error {
	for name := range translate.AskedAssignments(clusters) {
		if !sr.assignmentNames[name] {
			return fmt.Errorf("snapshot is inconsistent: cluster %q has no assignment", name)
		}
	}
	full, err := cachev3.NewSnapshot("check", map[resource.Type][]types.Resource{
		resource.ListenerType: listeners,
		resource.RouteType:    sr.routes,
	})
	if err != nil {
		return fmt.Errorf("build snapshot: %w", err)
	}
	if err := full.Consistent(); err != nil {
		return fmt.Errorf("snapshot is inconsistent: %w", err)
	}
	return nil
}

// asResources lists items as the caches take them.
func asResources[T types.Resource](items []T) []types.Resource {
	out := make([]types.Resource, 0, len(items))
	for _, x := range items {
		out = append(out, x)
	}
	return out
}

package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/servemesh/servemesh/controlplane/model"
	"github.com/servemesh/servemesh/wire"
	"github.com/servemesh/servemesh/xds/translate"
)

// publish translates the current model and hands it to the caches: assignments
// that changed to the LinearCache first (so new clusters can warm), then one
// snapshot per node, then endpoint removals. When the model is the one last
// published and only nodes connected since, just their snapshots are built.
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
	shared, err := translate.Shared(m, mtls)
	if err != nil { // SetModel validated it, so this is a bug
		s.log.Error("translating an accepted model failed", "generation", gen, "err", err)
		return
	}
	built, err := buildShared(m, mtls, shared)
	if err != nil {
		s.log.Error("building shared resources failed", "generation", gen, "err", err)
		return
	}
	s.built, s.builtGen = built, gen

	changed, removed := s.diffAssignments(built.assignments)
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
	s.log.Debug("published", "generation", gen, "nodes", len(nodes), "assignments_changed", len(changed),
		"assignments_removed", len(removed), "took", time.Since(start))
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
// publish and the names that disappeared, and records the new set.
func (s *Server) diffAssignments(next map[string]types.Resource) (map[string]types.Resource, []string) {
	changed := map[string]types.Resource{}
	for name, cla := range next {
		if old, ok := s.publishedAssignments[name]; !ok || !proto.Equal(old, cla) {
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

// sharedResources are one publish's node-independent resources, and what
// ForNode needs to build each node's own.
type sharedResources struct {
	model                  *model.Model
	mtls                   *translate.MTLS
	routes, clusters       []types.Resource
	clusterList            []*cluster.Cluster // clusters, as translated
	clusterByName          map[string]*cluster.Cluster
	routesVer, clustersVer string
	assignments            map[string]types.Resource
	assignmentList         []types.Resource
}

func buildShared(m *model.Model, mtls *translate.MTLS, r *translate.Resources) (*sharedResources, error) {
	out := &sharedResources{model: m, mtls: mtls,
		assignments: make(map[string]types.Resource, len(r.Assignments))}
	out.routes, out.clusters, out.clusterList = asResources(r.Routes), asResources(r.Clusters), r.Clusters
	out.clusterByName = translate.ClustersByName(r.Clusters)
	for _, x := range r.Assignments {
		out.assignments[x.GetClusterName()] = x
		out.assignmentList = append(out.assignmentList, x)
	}
	var err error
	if out.routesVer, err = contentVersion(out.routes); err != nil {
		return nil, err
	}
	if out.clustersVer, err = contentVersion(out.clusters); err != nil {
		return nil, err
	}
	return out, nil
}

// snapshotFor builds a node's snapshot of listeners, routes and clusters, each
// type versioned by a hash of its content, after checking that it is
// consistent together with the assignments (every cluster has its assignment,
// every listener its route configuration).
func (sr *sharedResources) snapshotFor(node wire.ProxyNode) (*cachev3.Snapshot, error) {
	own, err := translate.ForNode(sr.model, node, sr.mtls, sr.clusterByName)
	if err != nil {
		return nil, err
	}
	listeners := asResources(own.Listeners)
	listenersVer, err := contentVersion(listeners)
	if err != nil {
		return nil, err
	}
	clusters, clustersVer, merged := sr.clusters, sr.clustersVer, sr.clusterList
	if len(own.Clusters) > 0 { // mTLS: the node's own, replacing shared ones of the same name
		ownVer, err := contentVersion(asResources(own.Clusters))
		if err != nil {
			return nil, err
		}
		merged = translate.MergeClusters(sr.clusterList, own.Clusters)
		clusters = asResources(merged)
		clustersVer += "-" + ownVer
	}
	names := translate.AskedAssignments(merged)
	asked := make([]types.Resource, 0, len(names))
	for _, cla := range sr.assignmentList {
		if names[cla.(*endpoint.ClusterLoadAssignment).GetClusterName()] {
			asked = append(asked, cla)
		}
	}
	full, err := cachev3.NewSnapshot("check", map[resource.Type][]types.Resource{
		resource.ListenerType: listeners,
		resource.RouteType:    sr.routes,
		resource.ClusterType:  clusters,
		resource.EndpointType: asked,
	})
	if err != nil {
		return nil, fmt.Errorf("build snapshot: %w", err)
	}
	if err := full.Consistent(); err != nil {
		return nil, fmt.Errorf("snapshot is inconsistent: %w", err)
	}
	snap, err := cachev3.NewSnapshot("", map[resource.Type][]types.Resource{
		resource.ListenerType: listeners,
		resource.RouteType:    sr.routes,
		resource.ClusterType:  clusters,
	})
	if err != nil {
		return nil, fmt.Errorf("build snapshot: %w", err)
	}
	snap.Resources[types.Listener].Version = listenersVer
	snap.Resources[types.Route].Version = sr.routesVer
	snap.Resources[types.Cluster].Version = clustersVer
	return snap, nil
}

// asResources lists items as the caches take them.
func asResources[T types.Resource](items []T) []types.Resource {
	out := make([]types.Resource, 0, len(items))
	for _, x := range items {
		out = append(out, x)
	}
	return out
}

// contentVersion hashes resources (in their given, deterministic order), so an
// unchanged resource set keeps its version and is not re-sent.
func contentVersion(items []types.Resource) (string, error) {
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

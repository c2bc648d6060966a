package translate

import (
	"fmt"
	"slices"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"

	"github.com/servemesh/servemesh/ir"
)

// backendFeature is one feature's part in translating a backend: what it
// changes of the backend's clusters and of how its nodes call it. Each is
// registered once, in backendFeatures; translation asks the features a
// backend uses at each resource instead of testing each feature where the
// resource is built. (HTTP filters are registered in filters.go's table.)
type backendFeature interface {
	name() string
	// uses reports whether backend b uses the feature.
	uses(b ir.Backend) bool
	// sharedCluster changes the backend's cluster of nodes, the one every
	// calling node gets (with mTLS).
	sharedCluster(c *cluster.Cluster) error
	// inboundCluster changes a node's cluster of its own replicas of the
	// backend (its inbound listener's).
	inboundCluster(c *cluster.Cluster) error
	// viaInboundOnly is true when a node running replicas of the backend
	// calls them through its own inbound listener, as other nodes do,
	// rather than through its own view of the backend (replicas on
	// loopback).
	viaInboundOnly() bool
	// nodeClusters are the clusters a node running the backend needs
	// besides the backend's.
	nodeClusters() []*cluster.Cluster
}

// backendFeatures are the registered backend features, in the order they
// apply.
var backendFeatures = []backendFeature{loadAwarePicking{}}

// featuresOf are the features b uses, in backendFeatures' order.
func featuresOf(b ir.Backend) []backendFeature {
	var out []backendFeature
	for _, f := range backendFeatures {
		if f.uses(b) {
			out = append(out, f)
		}
	}
	return out
}

// patchSharedCluster applies b's features to its shared cluster c.
func patchSharedCluster(b ir.Backend, c *cluster.Cluster) error {
	for _, f := range featuresOf(b) {
		if err := f.sharedCluster(c); err != nil {
			return fmt.Errorf("backend %s, %s: %w", b.Name, f.name(), err)
		}
	}
	return nil
}

// patchInboundCluster applies b's features to a node's inbound cluster c.
func patchInboundCluster(b ir.Backend, c *cluster.Cluster) error {
	for _, f := range featuresOf(b) {
		if err := f.inboundCluster(c); err != nil {
			return fmt.Errorf("backend %s, %s: %w", b.Name, f.name(), err)
		}
	}
	return nil
}

// hasNodeView reports whether a node running replicas of b gets its own
// view of b's cluster.
func hasNodeView(b ir.Backend) bool {
	return !slices.ContainsFunc(featuresOf(b), backendFeature.viaInboundOnly)
}

// featureClusters are the clusters the features of the backends in local
// need on their node, each once, in the features' order.
func featureClusters(local []ir.Backend) []*cluster.Cluster {
	var out []*cluster.Cluster
	for _, f := range backendFeatures {
		if slices.ContainsFunc(local, f.uses) {
			out = append(out, f.nodeClusters()...)
		}
	}
	return out
}

// loadAwarePicking is load_aware: calling nodes weigh the backend's nodes
// by the load reports on their answers (client-side weighted round robin),
// and each node's picker picks the replica (ext_proc on the inbound
// listener, then override_host), so a node calls its own replicas through
// its inbound listener too, where the picker sees every request.
type loadAwarePicking struct{}

func (loadAwarePicking) name() string                            { return "load_aware" }
func (loadAwarePicking) uses(b ir.Backend) bool                  { return loadAware(b) }
func (loadAwarePicking) sharedCluster(c *cluster.Cluster) error  { return loadAwareCluster(c) }
func (loadAwarePicking) inboundCluster(c *cluster.Cluster) error { return pickedReplicaCluster(c) }
func (loadAwarePicking) viaInboundOnly() bool                    { return true }
func (loadAwarePicking) nodeClusters() []*cluster.Cluster        { return []*cluster.Cluster{pickerCluster()} }

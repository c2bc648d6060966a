package translate

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"

	"github.com/servemesh/servemesh/internal/parallel"
	"github.com/servemesh/servemesh/ir"
	"github.com/servemesh/servemesh/wire"
	"github.com/servemesh/servemesh/xds/cache"
)

// A node's own resources, built incrementally (Builder.ForNode). With
// mTLS a node has, for each backend it runs, a filter chain on its
// inbound listener and one or two clusters (its inbound cluster, its view
// of the backend), so a node of a large mesh owns hundreds of each. They
// depend on different things, and are kept apart so that a change
// rebuilds what depends on it:
//
//   - the node's listeners on its settings, the mesh's tracing and public
//     filters, and each local backend's configuration without its
//     replicas (configHash): a replica coming or going, which changes the
//     backends' clusters (their circuit breakers count replicas), leaves
//     the listeners, and their version, as they were;
//   - an inbound chain on its backend's configuration, kept per backend;
//   - a backend's clusters on the node (clusterPart), kept per backend,
//     each with its own version, so that the node is sent the clusters
//     that changed and not every one it owns: its inbound cluster on the
//     backend's configuration and its count of replicas here, its view of
//     the backend on the shared cluster.
//
// ForNodes builds many nodes at once, in parallel; the backends' parts
// are only read there.

// NodeBuilt is one node's own resources (ForNode's), with versions.
type NodeBuilt struct {
	Resources
	ListenersVersion, ClustersVersion string
	// EncodedListeners and EncodedClusters are Listeners and Clusters
	// encoded, in their order, as they are sent, each with its version,
	// which changes with it alone.
	EncodedListeners, EncodedClusters []Encoded
}

// ClusterVersions are the versions of Clusters, by name.
func (n *NodeBuilt) ClusterVersions() map[string]string {
	out := make(map[string]string, len(n.EncodedClusters))
	for _, e := range n.EncodedClusters {
		out[e.Name] = e.Version
	}
	return out
}

// nodeParts is what ForNode built last for a node, and from what.
type nodeParts struct {
	node    wire.ProxyNode
	tracing ir.Tracing // the zero value: none
	// chainKeys and clusterKeys are what the node's listeners and clusters
	// were built from, one per local backend, sorted by name.
	chainKeys   []configKey
	clusterKeys []localKey
	chains      map[string]chainPart   // by backend
	clusters    map[string]clusterPart // by backend
	services    []versionedCluster     // nodeServiceClusters, with their versions
	built       *NodeBuilt
}

// configKey names a backend's configuration: what its inbound chain
// depends on.
type configKey struct{ backend, config string }

// localKey is what a node's clusters of a backend depend on: the
// backend's shared cluster (its hash), its configuration, and its count of
// replicas there, not their addresses or health, which come by EDS.
type localKey struct {
	backend, hash, config string
	replicas              int
}

// chainPart is a backend's inbound chain on a node, built from its
// configuration.
type chainPart struct {
	config string
	chain  *listener.FilterChain
}

// clusterPart is a backend's clusters on a node: its inbound cluster,
// rebuilt when the backend's configuration or its count of replicas on
// the node changes (its circuit breakers count them), and its view of
// the backend's shared cluster, when it has one, rebuilt when the shared
// cluster changes.
type clusterPart struct {
	key     localKey
	inbound versionedCluster
	view    *versionedCluster
}

// count is how many clusters the part has: its inbound cluster, then
// its view if it has one, in the order the node lists them.
func (c clusterPart) count() int {
	if c.view == nil {
		return 1
	}
	return 2
}

// versionedCluster is a cluster with its encoding, versioned by it.
type versionedCluster struct {
	cluster *cluster.Cluster
	encoded Encoded
}

// ForNode builds what node owns, as ForNode does, from the last Build,
// rebuilding only the parts whose inputs changed since it last built the
// node (above).
func (b *Builder) ForNode(node wire.ProxyNode) (*NodeBuilt, error) {
	built, errs := b.ForNodes([]wire.ProxyNode{node})
	return built[0], errs[0]
}

// ForNodes is ForNode for each of nodes, built in parallel: a node's own
// parts depend on the node and the backends' parts, which are only read.
// Each node has its result and its error at its index.
func (b *Builder) ForNodes(nodes []wire.ProxyNode) ([]*NodeBuilt, []error) {
	b.indexByNode() // before the nodes, built in parallel, read it
	built, errs := make([]*NodeBuilt, len(nodes)), make([]error, len(nodes))
	parts := make([]*nodeParts, len(nodes))
	for i, n := range nodes {
		// The entry holds its inputs, the node's settings and the keys
		// of its chains and clusters, which forNode compares.
		parts[i], _ = b.nodes.Get(n.ID, "")
	}
	chains := &sharedChains{built: map[chainKey]*listener.FilterChain{}, off: !b.cache.On()}
	_ = parallel.Each(len(nodes), func(i int) error {
		parts[i], built[i], errs[i] = b.forNode(nodes[i], parts[i], chains)
		return nil // each node's error is its own
	})
	for i, n := range nodes {
		if errs[i] == nil {
			b.nodes.Put(n.ID, "", parts[i])
		}
	}
	return built, errs
}

// forNode builds node's own resources from prev, what was built for it
// last (nil: nothing), and returns what to keep for it next time; chains
// are the inbound chains built for the other nodes of the same ForNodes.
func (b *Builder) forNode(node wire.ProxyNode, prev *nodeParts, chains *sharedChains) (*nodeParts, *NodeBuilt, error) {
	local := b.localParts(node.ID)
	chainKeys, clusterKeys := make([]configKey, len(local)), make([]localKey, len(local))
	for i, p := range local {
		chainKeys[i] = configKey{backend: p.backend.Name, config: p.config}
		clusterKeys[i] = localKey{backend: p.backend.Name, hash: p.hash, config: p.config, replicas: p.perNode[node.ID]}
	}
	var tracing ir.Tracing
	if b.tracing != nil {
		tracing = *b.tracing
	}
	if prev == nil || !prev.node.Equal(node) || prev.tracing != tracing {
		services, err := versionAll(nodeServiceClusters(b.mtls, b.tracing))
		if err != nil {
			return nil, nil, err
		}
		prev = &nodeParts{node: node, tracing: tracing, services: services,
			chains: map[string]chainPart{}, clusters: map[string]clusterPart{}}
	}
	sameListeners := prev.built != nil && slices.Equal(prev.chainKeys, chainKeys)
	sameClusters := prev.built != nil && slices.Equal(prev.clusterKeys, clusterKeys)
	if sameListeners && sameClusters {
		return prev, prev.built, nil
	}
	out := &NodeBuilt{}
	if sameListeners {
		out.Listeners, out.ListenersVersion = prev.built.Listeners, prev.built.ListenersVersion
		out.EncodedListeners = prev.built.EncodedListeners
	} else if err := b.nodeListeners(prev, onNode(local, node.ID), chainKeys, chains, out); err != nil {
		return nil, nil, err
	}
	if sameClusters {
		out.Clusters, out.ClustersVersion = prev.built.Clusters, prev.built.ClustersVersion
		out.EncodedClusters = prev.built.EncodedClusters
	} else {
		if err := b.nodeClusters(prev, local, clusterKeys, out); err != nil {
			return nil, nil, err
		}
		// Checked here, in parallel, rather than once a node's snapshot
		// is set, one node after the other.
		if err := AskedAreBuilt(out.Clusters, b.assignments); err != nil {
			return nil, nil, fmt.Errorf("node %q: %w", node.ID, err)
		}
	}
	prev.chainKeys, prev.clusterKeys, prev.built = chainKeys, clusterKeys, out
	return prev, out, nil
}

// localParts are, with mTLS, the parts of the backends with replicas on
// node, sorted by name.
func (b *Builder) localParts(node string) []*backendParts {
	if b.mtls == nil {
		return nil
	}
	var out []*backendParts
	for _, name := range sortedNames(b.nodeBackends(node)) {
		out = append(out, b.lastBackend(name))
	}
	return out
}

// onNode are local's backends, each with its replicas on node alone.
func onNode(local []*backendParts, node string) []ir.Backend {
	out := make([]ir.Backend, 0, len(local))
	for _, p := range local {
		out = append(out, replicasOn(p.backend, node))
	}
	return out
}

// nodeListeners builds the node's listeners into out, reusing each
// inbound chain whose backend's configuration is what it was, or that
// another node built alike (shared).
func (b *Builder) nodeListeners(p *nodeParts, backends []ir.Backend, keys []configKey, shared *sharedChains, out *NodeBuilt) error {
	chains := make(map[string]chainPart, len(backends))
	configs := make(map[string]string, len(keys))
	for _, k := range keys {
		configs[k.backend] = k.config
	}
	nodeKey := nodeChainKey(p.node, b.tracing) // once, not per chain
	listeners, err := nodeListeners(p.node, b.mtls, backends, b.tracing, func(be ir.Backend) (*listener.FilterChain, error) {
		config := configs[be.Name]
		c, ok := p.chains[be.Name]
		if !ok || c.config != config {
			chain, err := shared.get(nodeKey.of(be.Name, config), func() (*listener.FilterChain, error) {
				return inboundChain(p.node, b.mtls, be, b.tracing)
			})
			if err != nil {
				return nil, err
			}
			c = chainPart{config: config, chain: chain}
		}
		chains[be.Name] = c
		return c.chain, nil
	})
	if err != nil {
		return err
	}
	out.EncodedListeners = make([]Encoded, len(listeners))
	h := newKindHash()
	for i, l := range listeners {
		if out.EncodedListeners[i], err = encode(l.GetName(), l); err != nil {
			return err
		}
		h.add(out.EncodedListeners[i].Name, out.EncodedListeners[i].Version)
	}
	out.Listeners, out.ListenersVersion, p.chains = listeners, h.sum(), chains
	return nil
}

// nodeClusters builds the node's clusters into out: the agent's services'
// and, per local backend, its part (clusterPart), rebuilt where its
// inputs changed.
func (b *Builder) nodeClusters(p *nodeParts, local []*backendParts, keys []localKey, out *NodeBuilt) error {
	parts := make(map[string]clusterPart, len(local))
	n := len(p.services)
	for i, shared := range local {
		name := shared.backend.Name
		part, err := ownClusters(p.clusters[name], shared, keys[i], p.node.ID)
		if err != nil {
			return err
		}
		parts[name] = part
		n += part.count()
	}
	h := newKindHash()
	out.Clusters, out.EncodedClusters = make([]*cluster.Cluster, 0, n), make([]Encoded, 0, n)
	add := func(v versionedCluster) {
		out.Clusters, out.EncodedClusters = append(out.Clusters, v.cluster), append(out.EncodedClusters, v.encoded)
		h.add(v.encoded.Name, v.encoded.Version)
	}
	for _, v := range p.services {
		add(v)
	}
	for _, shared := range local {
		part := parts[shared.backend.Name]
		add(part.inbound)
		if part.view != nil {
			add(*part.view)
		}
	}
	out.ClustersVersion, p.clusters = h.sum(), parts
	return nil
}

// ownClusters is a backend's part on node: last's (the part built last,
// or the zero value) where its inputs are the same, else built anew from
// the backend's parts (its inbound cluster from the backend with its
// replicas on node alone).
func ownClusters(last clusterPart, shared *backendParts, key localKey, node string) (clusterPart, error) {
	if last.key == key {
		return last, nil
	}
	be := shared.backend
	part := clusterPart{key: key, inbound: last.inbound, view: last.view}
	if last.inbound.cluster == nil || last.key.config != key.config || last.key.replicas != key.replicas {
		var err error
		c, err := buildInboundCluster(be, node, key.replicas)
		if err != nil {
			return clusterPart{}, err
		}
		if part.inbound, err = versionOne(c); err != nil {
			return clusterPart{}, err
		}
	}
	if !hasNodeView(be) {
		part.view = nil
	} else if last.view == nil || last.key.hash != key.hash {
		view, err := sharedView(shared, be, node)
		if err != nil {
			return clusterPart{}, err
		}
		part.view = &view
	}
	return part, nil
}

// sharedView is node's view of a backend (localView), encoded from its
// shared cluster's encoding.
func sharedView(shared *backendParts, be ir.Backend, node string) (versionedCluster, error) {
	name := wire.ClusterName(be.Name)
	for _, c := range shared.encoded {
		if c.encoded.Name == name {
			view := localView(c.cluster, be, node)
			return versionOne(view)
		}
	}
	return versionedCluster{}, fmt.Errorf("node %q: no shared cluster of backend %q", node, be.Name)
}

// versionOne is c encoded, versioned by its encoding.
func versionOne(c *cluster.Cluster) (versionedCluster, error) {
	e, err := encode(c.GetName(), c)
	return versionedCluster{cluster: c, encoded: e}, err
}

// versionAll encodes each cluster, versioned by its encoding.
func versionAll(clusters []*cluster.Cluster) ([]versionedCluster, error) {
	out := make([]versionedCluster, len(clusters))
	for i, c := range clusters {
		var err error
		if out[i], err = versionOne(c); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// configHash hashes a backend's configuration: the backend without its
// replicas, as the IR serialises it.
func configHash(b ir.Backend) (string, error) {
	b.Replicas = nil
	data, err := json.Marshal(b)
	if err != nil {
		return "", fmt.Errorf("backend %s: hash its configuration: %w", b.Name, err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8]), nil
}

// KeepNodes drops what ForNode kept of nodes not in ids: gone from the
// mesh.
func (b *Builder) KeepNodes(ids map[string]bool) {
	b.cache.Retain(KindNodeParts, func(id string) bool { return ids[id] })
}

// nodeBackends returns, with mTLS, the names of the backends with replicas
// on node, as of the last Build.
func (b *Builder) nodeBackends(node string) map[string]bool {
	b.indexByNode()
	return b.byNode[node]
}

// indexByNode lists, once a Build, the backends with replicas on each
// node (byNode).
func (b *Builder) indexByNode() {
	if b.byNode != nil {
		return
	}
	b.byNode = map[string]map[string]bool{}
	cache.Each(b.cache, KindBackendParts, func(name string, p *backendParts) {
		for _, n := range p.nodes {
			if b.byNode[n] == nil {
				b.byNode[n] = map[string]bool{}
			}
			b.byNode[n][name] = true
		}
	})
}

package server

import (
	"maps"
	"sync"
	"weak"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"

	"github.com/servemesh/servemesh/xds/translate"
)

// kind is one type's resources in a node's snapshot, with the type's
// version and each resource's. Read-only once built, so nodes with the
// same resources of a type share one kind: a change builds the kinds it
// touched, once, not once per node.
//
// The resources are encoded once: go-control-plane marshals each resource
// it sends once per stream, so a route table a hundred nodes are sent
// would be marshalled a hundred times per change. twins holds each
// resource's twin instead (encoded): an empty message of the same type
// whose unknown fields hold the resource's deterministic encoding, which
// protobuf marshals verbatim, so marshalling it is a copy, and a node
// receives the resource byte for byte.
//
// A kind may lie over another (under): a node's clusters with mTLS are
// the mesh's and its own (mergedClusters), and thirty nodes' copies of
// the mesh's twins and versions cost a full publish a tenth of its time,
// and the collector as much again. Then twins, versions and sources hold
// the kind's own resources, which hide under's of the same name, and
// twin, versionOf, source, size, allTwins and allVersions read both; two
// kinds over the same one differ only in their own (diffFrom).
type kind struct {
	version  string
	twins    map[string]types.Resource // encoded twins, by name
	versions map[string]string         // by name: what delta xDS compares
	// sources are the resources twins encode, by name (reach.go lists a
	// cut's clusters from them).
	sources map[string]types.Resource
	// clusterList is, in the shared clusters' kind, the clusters as the
	// build listed them (sharedConsistent reads them in order).
	clusterList []*cluster.Cluster
	under       *kind
	// hidden counts under's resources the kind's own hide (size).
	hidden int

	allOnce sync.Once
	all     map[string]types.Resource // twins with under's, made when first asked

	allVersionsOnce sync.Once
	allVersionsMap  map[string]string // versions with under's, made when first asked

	withTTLOnce sync.Once
	withTTL     map[string]types.ResourceWithTTL // for state-of-the-world streams, made when first asked

	// diffs are what changes to this kind from each kind a stream held
	// before it (deltacache.go's diffFrom), by that kind.
	diffMu sync.Mutex
	diffs  map[weak.Pointer[kind]]*kindDiff
}

// newKind lists items under version, each with the version versionOf
// gives its name, encoded.
func newKind[T types.ResourceWithName](version string, items []T, versionOf func(name string) string) (*kind, error) {
	k := &kind{version: version, twins: make(map[string]types.Resource, len(items)),
		versions: make(map[string]string, len(items)), sources: make(map[string]types.Resource, len(items))}
	for _, x := range items {
		twin, err := translate.Encode(x)
		if err != nil {
			return nil, err
		}
		name := x.GetName()
		k.sources[name], k.versions[name], k.twins[name] = x, versionOf(name), twin
	}
	return k, nil
}

// encodedKind lists resources the translation encoded, under version.
func encodedKind(version string, items []translate.Encoded) *kind {
	k := &kind{version: version, twins: make(map[string]types.Resource, len(items)),
		versions: make(map[string]string, len(items)), sources: make(map[string]types.Resource, len(items))}
	for _, x := range items {
		k.twins[x.Name], k.versions[x.Name], k.sources[x.Name] = x.Resource, x.Version, x.Resource
	}
	return k
}

// twin is the twin of k's resource name, nil if k has none.
func (k *kind) twin(name string) types.Resource {
	if r, ok := k.twins[name]; ok || k.under == nil {
		return r
	}
	return k.under.twin(name)
}

// source is the resource name as translated.
func (k *kind) source(name string) (types.Resource, bool) {
	if r, ok := k.sources[name]; ok || k.under == nil {
		return r, ok
	}
	return k.under.source(name)
}

// versionOf is the version of k's resource name, if k has it.
func (k *kind) versionOf(name string) (string, bool) {
	if v, ok := k.versions[name]; ok || k.under == nil {
		return v, ok
	}
	return k.under.versionOf(name)
}

// size is how many resources k has.
func (k *kind) size() int {
	if k.under == nil {
		return len(k.versions)
	}
	return k.under.size() + len(k.versions) - k.hidden
}

// allVersions are the versions of every resource of k, by name: versions
// with under's (made once, when a stream first needs them whole; delta
// streams that hold all of k share the map, which is never altered).
func (k *kind) allVersions() map[string]string {
	if k.under == nil {
		return k.versions
	}
	return overlaid(&k.allVersionsOnce, &k.allVersionsMap, k.under.allVersions, k.versions)
}

// overlaid is own over under()'s map, made into *whole once.
func overlaid[V any](once *sync.Once, whole *map[string]V, under func() map[string]V, own map[string]V) map[string]V {
	once.Do(func() {
		*whole = maps.Clone(under())
		maps.Copy(*whole, own)
	})
	return *whole
}

// allTwins are every twin of k by name: twins, with under's (made once,
// when a state-of-the-world stream first asks).
func (k *kind) allTwins() map[string]types.Resource {
	if k.under == nil {
		return k.twins
	}
	return overlaid(&k.allOnce, &k.all, k.under.allTwins, k.twins)
}

// itemsWithTTL are the items as state-of-the-world responses take them.
func (k *kind) itemsWithTTL() map[string]types.ResourceWithTTL {
	k.withTTLOnce.Do(func() {
		all := k.allTwins()
		k.withTTL = make(map[string]types.ResourceWithTTL, len(all))
		for n, r := range all {
			k.withTTL[n] = types.ResourceWithTTL{Resource: r}
		}
	})
	return k.withTTL
}

// snapshot is one node's resources, by type URL: go-control-plane's
// ResourceSnapshot with each resource's version computed once, when it
// was built (translate.Built's versions), rather than by hashing every
// resource of every node's snapshot (cachev3.Snapshot's
// ConstructVersionMap), which would cost as much as sending them all.
type snapshot map[string]*kind

var _ cachev3.ResourceSnapshot = snapshot(nil)

// GetVersion is the version of a type's resources.
func (s snapshot) GetVersion(typeURL string) string {
	if k := s[typeURL]; k != nil {
		return k.version
	}
	return ""
}

// GetResourcesAndTTL lists a type's resources for state-of-the-world streams.
func (s snapshot) GetResourcesAndTTL(typeURL string) map[string]types.ResourceWithTTL {
	if k := s[typeURL]; k != nil {
		return k.itemsWithTTL()
	}
	return nil
}

// GetResources lists a type's resources by name.
func (s snapshot) GetResources(typeURL string) map[string]types.Resource {
	if k := s[typeURL]; k != nil {
		return k.allTwins()
	}
	return nil
}

// ConstructVersionMap has nothing to do: the versions were made with the
// resources.
func (s snapshot) ConstructVersionMap() error { return nil }

// GetVersionMap is each of a type's resources' version, by name.
func (s snapshot) GetVersionMap(typeURL string) map[string]string {
	if k := s[typeURL]; k != nil {
		return k.allVersions()
	}
	return nil
}

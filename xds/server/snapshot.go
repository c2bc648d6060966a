package server

import (
	"sync"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
)

// kind is one type's resources in a node's snapshot, with the type's
// version and each resource's. Read-only once built, so nodes with the
// same resources of a type share one kind: a change builds the kinds it
// touched, once, not once per node.
type kind struct {
	version  string
	items    map[string]types.Resource
	versions map[string]string // by name: what delta xDS compares

	withTTLOnce sync.Once
	withTTL     map[string]types.ResourceWithTTL // for state-of-the-world streams, made when first asked
}

// newKind lists items under version, each with the version versionOf
// gives its name.
func newKind[T types.ResourceWithName](version string, items []T, versionOf func(name string) string) *kind {
	k := &kind{version: version, items: make(map[string]types.Resource, len(items)), versions: make(map[string]string, len(items))}
	for _, x := range items {
		k.items[x.GetName()] = x
		k.versions[x.GetName()] = versionOf(x.GetName())
	}
	return k
}

// itemsWithTTL are the items as state-of-the-world responses take them.
func (k *kind) itemsWithTTL() map[string]types.ResourceWithTTL {
	k.withTTLOnce.Do(func() {
		k.withTTL = make(map[string]types.ResourceWithTTL, len(k.items))
		for n, r := range k.items {
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
		return k.items
	}
	return nil
}

// ConstructVersionMap has nothing to do: the versions were made with the
// resources.
func (s snapshot) ConstructVersionMap() error { return nil }

// GetVersionMap is each of a type's resources' version, by name.
func (s snapshot) GetVersionMap(typeURL string) map[string]string {
	if k := s[typeURL]; k != nil {
		return k.versions
	}
	return nil
}

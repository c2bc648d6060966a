package server

import (
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"

	"github.com/servemesh/servemesh/xds/translate"
)

// encodings is the xDS server's one cache of the resources it encodes
// itself (each resource's twin, see kind): by type, scope and name, with
// the version each twin encodes. The scope is "" for the resources every
// node shares (scoped routes) and a node's id for that node's own (its
// listeners). Route configurations, assignments and clusters come
// encoded from the builder, which encodes each as it builds it.
// A twin is reused while its resource's version (the translation's
// content hash) holds, and dropped as soon as the build declares it
// changed (invalidate, from translate.ChangeSet); a kind built for a type and scope replaces that
// type and scope's entries with its own, so what the inputs no longer
// have is dropped as the kind is built; a node gone drops its scope
// (forgetScopes). Only publish uses it, from one goroutine.
type encodings struct {
	by map[scopeKey]map[string]encoding
}

type scopeKey struct{ typ, scope string }

type encoding struct {
	version string
	twin    types.Resource
}

func newEncodings() *encodings { return &encodings{by: map[scopeKey]map[string]encoding{}} }

// kindEncoder encodes the resources of one kind being built, for one type
// and scope; commit makes its encodings the cache's for them.
type kindEncoder struct {
	e          *encodings
	key        scopeKey
	last, next map[string]encoding
}

// begin starts encoding a kind of n resources of typ in scope.
func (e *encodings) begin(typ, scope string, n int) *kindEncoder {
	key := scopeKey{typ, scope}
	return &kindEncoder{e: e, key: key, last: e.by[key], next: make(map[string]encoding, n)}
}

// twin is r's encoding: the cached one if it encodes the same version of
// name, else a new one.
func (k *kindEncoder) twin(name, version string, r types.Resource) (types.Resource, error) {
	if last, ok := k.last[name]; ok && version != "" && last.version == version {
		k.next[name] = last
		return last.twin, nil
	}
	twin, err := translate.Encode(r)
	if err != nil {
		return nil, err
	}
	k.next[name] = encoding{version: version, twin: twin}
	return twin, nil
}

// commit replaces the cache's encodings of the kind's type and scope with
// the kind's.
func (k *kindEncoder) commit() { k.e.by[k.key] = k.next }

// invalidate drops the encodings of typ in scope named in names: the
// build declared them changed (translate.ChangeSet).
func (e *encodings) invalidate(typ, scope string, names []string) {
	cached := e.by[scopeKey{typ, scope}]
	for _, n := range names {
		delete(cached, n)
	}
}

// forgetScopes drops the encodings of the nodes not in known.
func (e *encodings) forgetScopes(known map[string]bool) {
	for key := range e.by {
		if key.scope != "" && !known[key.scope] {
			delete(e.by, key)
		}
	}
}

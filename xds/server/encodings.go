package server

import (
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"

	"github.com/servemesh/servemesh/xds/translate"
)

// encodings is the xDS server's one cache of the resources it encodes
// itself (each resource's twin, see kind): by type and name, with the
// version each twin encodes: the scoped routes every node shares, and the
// scopes cut for nodes whose routes come on demand. Route
// configurations, assignments, clusters and nodes' listeners come
// encoded from the builder, which encodes each as it builds it.
// A twin is reused while its resource's version (the translation's
// content hash) holds, and dropped as soon as the build declares it
// changed (invalidate, from translate.ChangeSet); a kind built for a type
// replaces that type's entries with its own, so what the inputs no longer
// have is dropped as the kind is built. Only publish uses it, from one
// goroutine.
type encodings struct {
	by map[string]map[string]encoding // by type, then name
}

type encoding struct {
	version string
	twin    types.Resource
}

func newEncodings() *encodings { return &encodings{by: map[string]map[string]encoding{}} }

// kindEncoder encodes the resources of one kind being built, of one
// type; commit makes its encodings the cache's for it.
type kindEncoder struct {
	e          *encodings
	typ        string
	last, next map[string]encoding
}

// begin starts encoding a kind of n resources of typ.
func (e *encodings) begin(typ string, n int) *kindEncoder {
	return &kindEncoder{e: e, typ: typ, last: e.by[typ], next: make(map[string]encoding, n)}
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

// commit replaces the cache's encodings of the kind's type with the
// kind's.
func (k *kindEncoder) commit() { k.e.by[k.typ] = k.next }

// invalidate drops the encodings of typ named in names: the build
// declared them changed (translate.ChangeSet).
func (e *encodings) invalidate(typ string, names []string) {
	cached := e.by[typ]
	for _, n := range names {
		delete(cached, n)
	}
}

package store

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/internal/consulwatch"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// Consul stores the desired state in Consul's KV under a prefix; FORMAT.md
// describes the keys and values.
type Consul struct {
	kv     *api.KV
	prefix string
	log    *slog.Logger

	mu         sync.Mutex
	unreadable []Unreadable // what the last Load left out
	writer     *Writer      // who wrote the state the last Load read
}

// NewConsul returns a store under prefix (such as "servemesh") using
// client; Watch logs to log while Consul fails.
func NewConsul(client *api.Client, prefix string, log *slog.Logger) *Consul {
	return &Consul{kv: client.KV(), prefix: strings.Trim(prefix, "/"), log: log}
}

// Keys under the prefix.
func (c *Consul) metaKey() string                { return c.prefix + "/meta" }
func (c *Consul) leaderKey() string              { return c.prefix + "/leader" }
func (c *Consul) backendKey(name string) string  { return c.prefix + "/backends/" + name }
func (c *Consul) endpointKey(name string) string { return c.prefix + "/endpoints/" + name }
func (c *Consul) nodeKey(name string) string     { return c.prefix + "/nodes/" + name }
func (c *Consul) meshKey() string                { return c.prefix + "/mesh" }
func (c *Consul) pendingDir(id string) string    { return c.prefix + "/pending/" + id + "/" }

// The stored values: see FORMAT.md.
type metaValue struct {
	Schema    int       `json:"schema"`
	UpdatedAt time.Time `json:"updated_at"`
	// Pending names a committed change whose objects are not all written
	// yet: readers apply it on top of the object keys.
	Pending *pendingRef `json:"pending,omitempty"`
	// WrittenBy is the release and protocol of the controller that wrote
	// the state last; absent when that one announced none (protocol 1).
	WrittenBy *Writer `json:"written_by,omitempty"`
}

// Writer is a controller that writes the state, as the meta key names it.
type Writer struct {
	Version  string `json:"version"`
	Protocol int    `json:"protocol"`
}

type pendingRef struct {
	ID    string `json:"id"`
	Parts int    `json:"parts"`
}

type backendValue struct {
	Schema  int              `json:"schema"`
	Backend meshspec.Backend `json:"backend"`
	// Retiring marks a deleted backend whose replicas finish their
	// requests (meshspec.Model.Retiring). A previous release reads it as
	// a backend of no replicas, its placements draining.
	Retiring bool `json:"retiring,omitempty"`
}

type endpointValue struct {
	Schema   int               `json:"schema"`
	Endpoint meshspec.Endpoint `json:"endpoint"`
}

type nodeValue struct {
	Schema int               `json:"schema"`
	Node   meshspec.NodeSpec `json:"node"`
}

type meshValue struct {
	Schema int           `json:"schema"`
	Mesh   meshspec.Mesh `json:"mesh"`
}

type changeValue struct {
	Schema int    `json:"schema"`
	Change Change `json:"change"`
}

// Load implements Store with one consistent read of the whole prefix.
func (c *Consul) Load(ctx context.Context) (*meshspec.Model, Revision, error) {
	snap, err := c.snapshot(ctx)
	if err != nil {
		return nil, 0, err
	}
	c.mu.Lock()
	c.unreadable = snap.unreadable
	c.writer = snap.meta.WrittenBy
	c.mu.Unlock()
	return snap.model, snap.rev, nil
}

// checkWriter refuses to write state that a newer protocol wrote last: a
// controller rewriting it would drop what it does not know (the skew
// policy: controllers are never downgraded past a release that wrote).
func (c *Consul) checkWriter() error {
	c.mu.Lock()
	w := c.writer
	c.mu.Unlock()
	if w != nil && w.Protocol > wire.Protocol {
		return fmt.Errorf("%w: the stored state was last written by servemesh %s (protocol %d), and this controller runs %s (protocol %d), which would drop what it does not know; run a controller of protocol %d or later",
			ErrNewerWriter, w.Version, w.Protocol, wire.Version, wire.Protocol, w.Protocol)
	}
	return nil
}

// Unreadable implements Store.
func (c *Consul) Unreadable() []Unreadable {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Unreadable(nil), c.unreadable...)
}

// snapshot is one consistent read of the prefix, decoded.
type snapshot struct {
	model      *meshspec.Model
	rev        Revision
	meta       metaValue
	pending    *Change             // the pending change, if meta names a readable one
	parts      map[string][]string // pending id -> its part keys
	unreadable []Unreadable
}

func (c *Consul) snapshot(ctx context.Context) (*snapshot, error) {
	pairs, _, err := c.kv.List(c.prefix+"/", (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("store: list %s/ in consul: %w", c.prefix, err)
	}
	s := &snapshot{model: &meshspec.Model{}, parts: map[string][]string{}}
	partValues := map[string][]byte{}
	for _, p := range pairs {
		if reason := c.readPair(s, p, partValues); reason != "" {
			s.unreadable = append(s.unreadable, Unreadable{Key: p.Key, Reason: reason})
		}
	}
	if ref := s.meta.Pending; ref != nil {
		s.pending = c.readPending(s, *ref, partValues)
	}
	base := s.model
	if s.pending != nil {
		base = Apply(base, *s.pending)
	}
	s.model = dropDangling(base, s, c)
	return s, nil
}

// readPair decodes one key into s; it returns why the key cannot be read,
// or "".
func (c *Consul) readPair(s *snapshot, p *api.KVPair, partValues map[string][]byte) string {
	name := func(dir string) string { return strings.TrimPrefix(p.Key, c.prefix+dir) }
	switch {
	case p.Key == c.metaKey():
		s.rev = Revision(p.ModifyIndex) // the revision holds whatever the value says
		return decodeValue(p.Value, &s.meta.Schema, &s.meta)
	case p.Key == c.leaderKey():
		return ""
	case p.Key == c.meshKey():
		var v meshValue
		if reason := decodeValue(p.Value, &v.Schema, &v); reason != "" {
			return reason
		}
		s.model.Mesh = &v.Mesh
		return ""
	case strings.HasPrefix(p.Key, c.prefix+"/pending/"):
		id, _, _ := strings.Cut(name("/pending/"), "/")
		s.parts[id] = append(s.parts[id], p.Key)
		partValues[p.Key] = p.Value
		return ""
	case strings.HasPrefix(p.Key, c.prefix+"/backends/"):
		var v backendValue
		if reason := decodeValue(p.Value, &v.Schema, &v); reason != "" {
			return reason
		}
		if v.Backend.Name != name("/backends/") {
			return fmt.Sprintf("holds backend %q under another name", v.Backend.Name)
		}
		v.Backend = v.Backend.WithoutProcessOnlyFields() // stored by older versions, and never of effect
		if err := meshspec.ValidateBackend(v.Backend); err != nil {
			return err.Error()
		}
		if v.Retiring {
			s.model.Retiring = append(s.model.Retiring, v.Backend)
		} else {
			s.model.Backends = append(s.model.Backends, v.Backend)
		}
		return ""
	case strings.HasPrefix(p.Key, c.prefix+"/endpoints/"):
		var v endpointValue
		if reason := decodeValue(p.Value, &v.Schema, &v); reason != "" {
			return reason
		}
		if v.Endpoint.Name != name("/endpoints/") {
			return fmt.Sprintf("holds endpoint %q under another name", v.Endpoint.Name)
		}
		s.model.Endpoints = append(s.model.Endpoints, v.Endpoint)
		return ""
	case strings.HasPrefix(p.Key, c.prefix+"/nodes/"):
		var v nodeValue
		if reason := decodeValue(p.Value, &v.Schema, &v); reason != "" {
			return reason
		}
		if v.Node.Name != name("/nodes/") {
			return fmt.Sprintf("holds node %q under another name", v.Node.Name)
		}
		if err := meshspec.ValidateNode(v.Node); err != nil {
			return err.Error()
		}
		s.model.Nodes = append(s.model.Nodes, v.Node)
		return ""
	}
	return "not a key servemesh writes; it is left alone"
}

// decodeValue reads a stored JSON value of this schema; it returns why it
// cannot, or "".
func decodeValue(value []byte, schema *int, into any) string {
	if err := json.Unmarshal(value, into); err != nil {
		return "not a servemesh JSON value: " + err.Error()
	}
	if *schema != SchemaVersion {
		return fmt.Sprintf("schema %d; this servemesh reads schema %d (upgrade servemesh, or restore the key)", *schema, SchemaVersion)
	}
	return ""
}

// readPending reassembles the pending change ref names from its parts.
func (c *Consul) readPending(s *snapshot, ref pendingRef, partValues map[string][]byte) *Change {
	keys := s.parts[ref.ID]
	sort.Strings(keys)
	if len(keys) != ref.Parts {
		s.unreadable = append(s.unreadable, Unreadable{Key: c.pendingDir(ref.ID),
			Reason: fmt.Sprintf("the pending change has %d of its %d parts", len(keys), ref.Parts)})
		return nil
	}
	var record []byte
	for _, k := range keys {
		record = append(record, partValues[k]...)
	}
	var v changeValue
	if reason := decodeValue(record, &v.Schema, &v); reason != "" {
		s.unreadable = append(s.unreadable, Unreadable{Key: c.pendingDir(ref.ID), Reason: "the pending change: " + reason})
		return nil
	}
	return &v.Change
}

// dropDangling leaves out endpoints whose traffic or shadows name a backend
// the state lacks (one that could not be read), reporting them.
func dropDangling(m *meshspec.Model, s *snapshot, c *Consul) *meshspec.Model {
	have := make(map[string]bool, len(m.Backends))
	for _, b := range m.Backends {
		have[b.Name] = true
	}
	kept := m.Endpoints[:0:0]
	for _, e := range m.Endpoints {
		missing := ""
		for _, b := range append(meshspec.SortedKeys(e.Traffic), meshspec.SortedKeys(e.UsedBackends())...) {
			if !have[b] {
				missing = b
				break
			}
		}
		if missing != "" {
			s.unreadable = append(s.unreadable, Unreadable{Key: c.endpointKey(e.Name), Backend: missing,
				Reason: fmt.Sprintf("uses backend %q, which is not stored or cannot be read", missing)})
			continue
		}
		kept = append(kept, e)
	}
	m.Endpoints = kept
	return m
}

// Wait implements Store with a blocking query on the meta key, retried
// while Consul fails.
func (c *Consul) Wait(ctx context.Context, rev Revision) (Revision, error) {
	var next Revision
	first := true
	loopErr := consulwatch.Loop(ctx, c.log, "the stored state", func(ctx context.Context, index uint64) (uint64, error) {
		if first { // wait past rev; then past each answer
			index, first = uint64(rev), false
		}
		pair, meta, qerr := c.kv.Get(c.metaKey(), (&api.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Minute}).WithContext(ctx))
		if qerr != nil {
			return 0, qerr
		}
		if pair != nil && Revision(pair.ModifyIndex) != rev {
			next = Revision(pair.ModifyIndex)
			return 0, consulwatch.ErrDone
		}
		return meta.LastIndex, nil // nothing new for us: wait past this index
	})
	if loopErr != nil {
		return 0, loopErr
	}
	return next, nil
}

package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/controlplane/model"
)

// MaxValueBytes is Consul's limit on one KV value.
const MaxValueBytes = 512 * 1024

// Consul stores the desired state in Consul's KV under a prefix.
type Consul struct {
	kv     *api.KV
	prefix string
}

// NewConsul returns a store under prefix (such as "servemesh") using client.
func NewConsul(client *api.Client, prefix string) *Consul {
	return &Consul{kv: client.KV(), prefix: strings.Trim(prefix, "/")}
}

// Keys under the prefix.
func (c *Consul) metaKey() string                { return c.prefix + "/meta" }
func (c *Consul) backendKey(name string) string  { return c.prefix + "/backends/" + name }
func (c *Consul) endpointKey(name string) string { return c.prefix + "/endpoints/" + name }

// The stored values: see FORMAT.md.
type metaValue struct {
	Schema    int       `json:"schema"`
	UpdatedAt time.Time `json:"updated_at"`
}

type backendValue struct {
	Schema  int           `json:"schema"`
	Backend model.Backend `json:"backend"`
}

type endpointValue struct {
	Schema   int            `json:"schema"`
	Endpoint model.Endpoint `json:"endpoint"`
}

// Load implements Store with one consistent read of the whole prefix.
func (c *Consul) Load(ctx context.Context) (*model.Model, Revision, error) {
	pairs, _, err := c.kv.List(c.prefix+"/", (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, 0, fmt.Errorf("store: list %s/ in consul: %w", c.prefix, err)
	}
	m := &model.Model{}
	var rev Revision
	for _, p := range pairs {
		switch {
		case p.Key == c.metaKey():
			var meta metaValue
			if err := decode(p, &meta.Schema, &meta); err != nil {
				return nil, 0, err
			}
			rev = Revision(p.ModifyIndex)
		case strings.HasPrefix(p.Key, c.prefix+"/backends/"):
			var v backendValue
			if err := decode(p, &v.Schema, &v); err != nil {
				return nil, 0, err
			}
			m.Backends = append(m.Backends, v.Backend)
		case strings.HasPrefix(p.Key, c.prefix+"/endpoints/"):
			var v endpointValue
			if err := decode(p, &v.Schema, &v); err != nil {
				return nil, 0, err
			}
			m.Endpoints = append(m.Endpoints, v.Endpoint)
		}
	}
	return m, rev, nil
}

func decode(p *api.KVPair, schema *int, into any) error {
	if err := json.Unmarshal(p.Value, into); err != nil {
		return fmt.Errorf("store: consul key %s holds invalid JSON: %w", p.Key, err)
	}
	if *schema != SchemaVersion {
		return fmt.Errorf("store: consul key %s has schema %d; this servemesh reads schema %d (upgrade servemesh, or restore the key)", p.Key, *schema, SchemaVersion)
	}
	return nil
}

// Commit implements Store as one Consul transaction: a check-and-set of the
// meta key at rev, then the writes and deletes.
func (c *Consul) Commit(ctx context.Context, rev Revision, change Change) (Revision, error) {
	if change.Size() > MaxChangeObjects {
		return 0, fmt.Errorf("store: a change of %d objects exceeds %d; split it", change.Size(), MaxChangeObjects)
	}
	meta, err := json.Marshal(metaValue{Schema: SchemaVersion, UpdatedAt: time.Now().UTC()})
	if err != nil {
		return 0, fmt.Errorf("store: encode meta: %w", err)
	}
	ops := api.KVTxnOps{{Verb: api.KVCAS, Key: c.metaKey(), Value: meta, Index: uint64(rev)}}
	put := func(key string, v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("store: encode %s: %w", key, err)
		}
		if len(b) > MaxValueBytes {
			return fmt.Errorf("store: %s would be %d bytes, over Consul's %d-byte limit for one value", key, len(b), MaxValueBytes)
		}
		ops = append(ops, &api.KVTxnOp{Verb: api.KVSet, Key: key, Value: b})
		return nil
	}
	for _, b := range change.PutBackends {
		if err := put(c.backendKey(b.Name), backendValue{Schema: SchemaVersion, Backend: b}); err != nil {
			return 0, err
		}
	}
	for _, e := range change.PutEndpoints {
		if err := put(c.endpointKey(e.Name), endpointValue{Schema: SchemaVersion, Endpoint: e}); err != nil {
			return 0, err
		}
	}
	for _, n := range change.DeleteBackends {
		ops = append(ops, &api.KVTxnOp{Verb: api.KVDelete, Key: c.backendKey(n)})
	}
	for _, n := range change.DeleteEndpoints {
		ops = append(ops, &api.KVTxnOp{Verb: api.KVDelete, Key: c.endpointKey(n)})
	}
	ok, resp, _, err := c.kv.Txn(ops, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return 0, fmt.Errorf("store: consul transaction: %w", err)
	}
	if !ok {
		for _, e := range resp.Errors {
			if e.OpIndex == 0 {
				return 0, ErrConflict
			}
		}
		return 0, fmt.Errorf("store: consul transaction refused: %+v", resp.Errors)
	}
	return Revision(resp.Results[0].ModifyIndex), nil
}

// Watch implements Store with a blocking query on the meta key.
func (c *Consul) Watch(ctx context.Context, rev Revision) (*model.Model, Revision, error) {
	wait := uint64(rev)
	for {
		pair, meta, err := c.kv.Get(c.metaKey(), (&api.QueryOptions{WaitIndex: wait, WaitTime: 5 * time.Minute}).WithContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return nil, 0, ctx.Err()
			}
			select { // Consul unreachable: back off, then ask again
			case <-ctx.Done():
				return nil, 0, ctx.Err()
			case <-time.After(time.Second):
			}
			continue
		}
		if pair != nil && Revision(pair.ModifyIndex) != rev {
			return c.Load(ctx)
		}
		// Nothing new for us: wait past this index. An index that went
		// backwards (a restored Consul) restarts the wait from zero.
		if meta.LastIndex < wait {
			wait = 0
		} else {
			wait = meta.LastIndex
		}
	}
}

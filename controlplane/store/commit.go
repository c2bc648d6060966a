package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/wire"
)

const (
	// MaxValueBytes is the largest object servemesh stores in one value. A
	// Consul transaction carries its values base64-encoded within a 512 KiB
	// request (txn_max_req_len), so one value must stay well below that.
	MaxValueBytes = 360 << 10
	// maxTxnBytes bounds the keys and values of one transaction, before
	// encoding; maxTxnOps is Consul's limit on its operations.
	maxTxnBytes = 360 << 10
	maxTxnOps   = 64
	// partBytes is the size of one part of a large change's record.
	partBytes = 256 << 10
)

// Commit implements Store. A change that fits one Consul transaction is one
// transaction: a check-and-set of the meta key at rev, then the writes and
// deletes. A larger one is recorded in parts, committed by one
// check-and-set of the meta key that names the record, then applied to the
// object keys and cleared; see FORMAT.md.
func (c *Consul) Commit(ctx context.Context, rev Revision, change Change) (Revision, error) {
	if err := c.checkWriter(); err != nil {
		return 0, err
	}
	ops, size, err := c.objectOps(change)
	if err != nil {
		return 0, err
	}
	var next Revision
	if len(ops) < maxTxnOps && size <= maxTxnBytes {
		meta, err := encodeMeta(nil)
		if err != nil {
			return 0, err
		}
		next, err = c.casMeta(ctx, uint64(rev), meta, ops...)
		if err != nil {
			return 0, err
		}
	} else if next, err = c.commitLarge(ctx, rev, change, ops); err != nil {
		return 0, err
	}
	c.overwritten(ops)
	return next, nil
}

// overwritten forgets the unreadable keys ops wrote or deleted: a writer
// does not read its own commits back (Reader.Wait), so what Load last
// reported of them is no longer so.
func (c *Consul) overwritten(ops api.KVTxnOps) {
	keys := make(map[string]bool, len(ops))
	for _, op := range ops {
		keys[op.Key] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unreadable = slices.DeleteFunc(c.unreadable, func(u Unreadable) bool { return keys[u.Key] })
}

// objectOps turns a change into set and delete operations on object keys,
// and sums their bytes.
func (c *Consul) objectOps(change Change) (api.KVTxnOps, int, error) {
	var ops api.KVTxnOps
	size := 0
	put := func(key string, v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("store: encode %s: %w", key, err)
		}
		if len(b) > MaxValueBytes {
			return fmt.Errorf("%w: %s would be %d bytes; one object holds at most %d (fewer replicas or placements fit)", ErrTooLarge, key, len(b), MaxValueBytes)
		}
		ops = append(ops, &api.KVTxnOp{Verb: api.KVSet, Key: key, Value: b})
		size += len(key) + len(b)
		return nil
	}
	for _, b := range change.PutBackends {
		if err := put(c.backendKey(b.Name), backendValue{Schema: SchemaVersion, Backend: b}); err != nil {
			return nil, 0, err
		}
	}
	for _, b := range change.PutRetiring {
		if err := put(c.backendKey(b.Name), backendValue{Schema: SchemaVersion, Backend: b, Retiring: true}); err != nil {
			return nil, 0, err
		}
	}
	for _, e := range change.PutEndpoints {
		if err := put(c.endpointKey(e.Name), endpointValue{Schema: SchemaVersion, Endpoint: e}); err != nil {
			return nil, 0, err
		}
	}
	for _, n := range change.PutNodes {
		if err := put(c.nodeKey(n.Name), nodeValue{Schema: SchemaVersion, Node: n}); err != nil {
			return nil, 0, err
		}
	}
	if change.PutMesh != nil {
		if err := put(c.meshKey(), meshValue{Schema: SchemaVersion, Mesh: *change.PutMesh}); err != nil {
			return nil, 0, err
		}
	}
	if change.DeleteMesh {
		ops = append(ops, &api.KVTxnOp{Verb: api.KVDelete, Key: c.meshKey()})
		size += len(c.meshKey())
	}
	for _, n := range change.DeleteNodes {
		ops = append(ops, &api.KVTxnOp{Verb: api.KVDelete, Key: c.nodeKey(n)})
		size += len(n)
	}
	for _, n := range change.DeleteBackends {
		ops = append(ops, &api.KVTxnOp{Verb: api.KVDelete, Key: c.backendKey(n)})
		size += len(n)
	}
	for _, n := range change.DeleteEndpoints {
		ops = append(ops, &api.KVTxnOp{Verb: api.KVDelete, Key: c.endpointKey(n)})
		size += len(n)
	}
	return ops, size, nil
}

func encodeMeta(pending *pendingRef) ([]byte, error) {
	b, err := json.Marshal(metaValue{Schema: SchemaVersion, UpdatedAt: time.Now().UTC(), Pending: pending,
		WrittenBy: &Writer{Version: wire.Version, Protocol: wire.Protocol}})
	if err != nil {
		return nil, fmt.Errorf("store: encode meta: %w", err)
	}
	return b, nil
}

// casMeta runs one transaction: a check-and-set of the meta key at index,
// then ops. It returns the new revision, or ErrConflict.
func (c *Consul) casMeta(ctx context.Context, index uint64, meta []byte, ops ...*api.KVTxnOp) (Revision, error) {
	all := append(api.KVTxnOps{{Verb: api.KVCAS, Key: c.metaKey(), Value: meta, Index: index}}, ops...)
	ok, resp, _, err := c.kv.Txn(all, (&api.QueryOptions{}).WithContext(ctx))
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

// commitLarge records change in parts, commits it with one check-and-set
// of the meta key, then applies it. Until that check-and-set nothing is
// visible; after it the change is the stored state whatever happens next.
func (c *Consul) commitLarge(ctx context.Context, rev Revision, change Change, ops api.KVTxnOps) (Revision, error) {
	id, parts, err := c.writeRecord(ctx, change)
	if err != nil {
		return 0, err
	}
	meta, err := encodeMeta(&pendingRef{ID: id, Parts: parts})
	if err != nil {
		return 0, err
	}
	committed, err := c.casMeta(ctx, uint64(rev), meta)
	if err != nil {
		if errors.Is(err, ErrConflict) {
			c.dropRecord(id)
			return 0, err
		}
		// The answer was lost: ask whether the meta key names the record.
		named, rerr := c.namesPending(ctx, id)
		switch {
		case rerr != nil:
			return 0, fmt.Errorf("store: the commit's outcome is unknown (%w; reading it back: %w); the leader settles it either way", err, rerr)
		case !named:
			c.dropRecord(id)
			return 0, err
		}
		return 0, fmt.Errorf("%w (%s); the store settles it", ErrCommitted, err.Error())
	}
	final, err := c.rollForward(ctx, uint64(committed), id, ops)
	if err != nil {
		return committed, fmt.Errorf("%w; applying it was interrupted (%s) and the store settles it", ErrCommitted, err.Error())
	}
	return final, nil
}

// writeRecord stores change in parts under a fresh pending id.
func (c *Consul) writeRecord(ctx context.Context, change Change) (string, int, error) {
	record, err := json.Marshal(changeValue{Schema: SchemaVersion, Change: change})
	if err != nil {
		return "", 0, fmt.Errorf("store: encode change: %w", err)
	}
	var raw [8]byte
	_, _ = rand.Read(raw[:])
	id := hex.EncodeToString(raw[:])
	parts := 0
	for start := 0; start < len(record); start += partBytes {
		part := record[start:min(start+partBytes, len(record))]
		key := fmt.Sprintf("%s%06d", c.pendingDir(id), parts)
		if _, err := c.kv.Put(&api.KVPair{Key: key, Value: part}, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
			c.dropRecord(id)
			return "", 0, fmt.Errorf("store: write part %d of a change: %w", parts, err)
		}
		parts++
	}
	return id, parts, nil
}

// namesPending reports whether the meta key names pending id, for a commit
// whose answer was lost.
func (c *Consul) namesPending(ctx context.Context, id string) (bool, error) {
	pair, _, err := c.kv.Get(c.metaKey(), (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return false, err
	}
	var meta metaValue
	if pair == nil {
		return false, nil
	}
	if err := json.Unmarshal(pair.Value, &meta); err != nil {
		return false, fmt.Errorf("store: the meta key holds invalid JSON: %w", err)
	}
	return meta.Pending != nil && meta.Pending.ID == id, nil
}

// dropRecord deletes a pending record that was never committed.
func (c *Consul) dropRecord(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = c.kv.DeleteTree(c.pendingDir(id), (&api.WriteOptions{}).WithContext(ctx))
}

// rollForward writes a committed change's objects in batches, each guarded
// by the meta key still being at index (so a writer that lost the lock
// stops), then clears the pending record and returns the final revision.
func (c *Consul) rollForward(ctx context.Context, index uint64, id string, ops api.KVTxnOps) (Revision, error) {
	guard := &api.KVTxnOp{Verb: api.KVCheckIndex, Key: c.metaKey(), Index: index}
	for len(ops) > 0 {
		n, size := 0, 0
		for n < len(ops) && n < maxTxnOps-1 && (n == 0 || size+len(ops[n].Key)+len(ops[n].Value) <= maxTxnBytes) {
			size += len(ops[n].Key) + len(ops[n].Value)
			n++
		}
		ok, resp, _, err := c.kv.Txn(append(api.KVTxnOps{guard}, ops[:n]...), (&api.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return 0, fmt.Errorf("store: consul transaction: %w", err)
		}
		if !ok {
			return 0, fmt.Errorf("store: the stored state moved on while a change was applied: %+v", resp.Errors)
		}
		ops = ops[n:]
	}
	meta, err := encodeMeta(nil)
	if err != nil {
		return 0, err
	}
	return c.casMeta(ctx, index, meta, &api.KVTxnOp{Verb: api.KVDeleteTree, Key: c.pendingDir(id)})
}

// Settle implements Store: it finishes applying a committed change a
// crashed writer left pending, and deletes records that were never
// committed. A pending record that cannot be read is dropped, and the
// error says so.
func (c *Consul) Settle(ctx context.Context) error {
	s, err := c.snapshot(ctx)
	if err != nil {
		return err
	}
	var ref *pendingRef
	if s.meta.Pending != nil {
		ref = s.meta.Pending
	}
	for id := range s.parts {
		if ref == nil || id != ref.ID {
			c.dropRecord(id) // never committed
		}
	}
	if ref == nil {
		return nil
	}
	if s.pending == nil {
		meta, err := encodeMeta(nil)
		if err != nil {
			return err
		}
		_, err = c.casMeta(ctx, uint64(s.rev), meta, &api.KVTxnOp{Verb: api.KVDeleteTree, Key: c.pendingDir(ref.ID)})
		return errors.Join(err, fmt.Errorf("store: the pending change %s could not be read and was dropped", ref.ID))
	}
	ops, _, err := c.objectOps(*s.pending)
	if err != nil {
		return err
	}
	_, err = c.rollForward(ctx, uint64(s.rev), ref.ID, ops)
	return err
}

package store

import (
	"context"
	"sync"

	"github.com/servemesh/servemesh/meshspec"
)

// Memory is a Store in memory: the same semantics as Consul, for unit tests.
type Memory struct {
	mu      sync.Mutex
	model   *meshspec.Model
	rev     Revision
	changed chan struct{} // closed and replaced on every commit
}

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory {
	return &Memory{model: &meshspec.Model{}, changed: make(chan struct{})}
}

// Load implements Store.
func (m *Memory) Load(context.Context) (*meshspec.Model, Revision, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return meshspec.Clone(m.model), m.rev, nil
}

// Commit implements Store.
func (m *Memory) Commit(_ context.Context, rev Revision, c Change) (Revision, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rev != m.rev {
		return 0, ErrConflict
	}
	m.model = Apply(m.model, c)
	m.rev++
	close(m.changed)
	m.changed = make(chan struct{})
	return m.rev, nil
}

// Wait implements Store.
func (m *Memory) Wait(ctx context.Context, rev Revision) (Revision, error) {
	for {
		m.mu.Lock()
		if m.rev != rev {
			r := m.rev
			m.mu.Unlock()
			return r, nil
		}
		ch := m.changed
		m.mu.Unlock()
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-ch:
		}
	}
}

// Settle implements Store: a memory store is never half-written.
func (m *Memory) Settle(context.Context) error { return nil }

// Unreadable implements Store: a memory store holds only what it read.
func (m *Memory) Unreadable() []Unreadable { return nil }

package demoreplica

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/servemesh/servemesh/internal/rungroup"
	"github.com/servemesh/servemesh/meshspec"
)

// Fleet runs demo replicas in this process, one per address: the replicas
// of `servemesh demo` and of `servemesh demo-replica`.
type Fleet struct {
	log      *slog.Logger
	mu       sync.Mutex
	replicas map[string]*Replica // by address
	servers  []*http.Server
	serving  sync.WaitGroup // Start's servers; Stop waits for them
}

// NewFleet returns a fleet running no replica.
func NewFleet(log *slog.Logger) *Fleet {
	return &Fleet{log: log, replicas: map[string]*Replica{}}
}

// Ensure starts a replica for every static replica address in m that the
// fleet does not run yet.
func (f *Fleet) Ensure(ctx context.Context, m *meshspec.Model) error {
	for _, b := range m.Backends {
		for _, r := range b.Replicas {
			f.mu.Lock()
			_, running := f.replicas[r.Address]
			f.mu.Unlock()
			if !running {
				if err := f.Start(ctx, b.Name, "", r.Address); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Start runs a replica of backend named name (a fresh tag when empty) on
// addr, until Stop.
func (f *Fleet) Start(ctx context.Context, backend, name, addr string) error {
	lis, srv, err := f.listen(ctx, backend, name, addr)
	if err != nil {
		return err
	}
	f.serving.Go(func() {
		if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			f.log.Error("demo replica stopped serving", "backend", backend, "address", addr, "err", err)
		}
	})
	return nil
}

// Serve runs a replica as Start does, until ctx ends or it fails.
func (f *Fleet) Serve(ctx context.Context, backend, name, addr string) error {
	lis, srv, err := f.listen(ctx, backend, name, addr)
	if err != nil {
		return err
	}
	return rungroup.Serve(ctx, func() error { return srv.Serve(lis) }, func() { _ = srv.Close() })
}

// listen binds addr for a replica of backend named name (a fresh tag when
// empty) and records it.
func (f *Fleet) listen(ctx context.Context, backend, name, addr string) (net.Listener, *http.Server, error) {
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("demo replica of %s: %w", backend, err)
	}
	if name == "" {
		var tag [3]byte
		_, _ = rand.Read(tag[:])
		name = backend + "#" + hex.EncodeToString(tag[:])
	}
	r := &Replica{Backend: backend, Name: name}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	f.mu.Lock()
	f.replicas[addr] = r
	f.servers = append(f.servers, srv)
	f.mu.Unlock()
	f.log.Info("demo replica serving", "backend", backend, "replica", r.Name, "address", addr)
	return lis, srv, nil
}

// Counts returns requests served per backend, as "backend=n" sorted.
func (f *Fleet) Counts() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	per := map[string]int64{}
	for _, r := range f.replicas {
		per[r.Backend] += r.Served()
	}
	parts := make([]string, 0, len(per))
	for b, n := range per {
		parts = append(parts, fmt.Sprintf("%s=%d", b, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// Stop closes every replica and waits for Start's to stop serving.
func (f *Fleet) Stop() {
	f.mu.Lock()
	for _, s := range f.servers {
		_ = s.Close()
	}
	f.mu.Unlock()
	f.serving.Wait()
}

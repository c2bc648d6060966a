package secrets

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/connect"
	"github.com/servemesh/servemesh/internal/consulwatch"
	"github.com/servemesh/servemesh/wire"
)

// Files keeps a node's file-based SDS configs (wire.SecretFile) in step
// with Consul's service-mesh CA, for its Envoy: the node's identity
// (wire.NodeSecret, for xDS and for calling other nodes), the CA roots
// (wire.RootsSecret) and the identity of each backend the node runs
// replicas of (wire.BackendSecret). Each is followed with a blocking query
// and its file replaced by rename when Consul renews or re-signs it, which
// Envoy picks up without a restart. No secret reaches a replica: the folder
// is the agent's alone (0700).
type Files struct {
	dir    string
	consul *api.Client
	node   string
	log    *slog.Logger

	watches sync.WaitGroup // every watch Start and AddBackend begin

	mu       sync.Mutex
	ctx      context.Context               // from Start: ends every watch
	backends map[string]context.CancelFunc // followed; ends the watch
	written  map[string][]byte
	prefix   string // the node leaf's identity prefix
}

// New returns the secrets of node in dir (an absolute path).
func New(dir string, consul *api.Client, node string, log *slog.Logger) *Files {
	return &Files{dir: dir, consul: consul, node: node, log: log, backends: map[string]context.CancelFunc{}, written: map[string][]byte{}}
}

// IdentityPrefix is the SPIFFE id of the mesh's services without a name, as
// the node's leaf says ("spiffe://<trust domain>/ns/default/dc/<dc>/svc/"),
// once Start has returned.
func (s *Files) IdentityPrefix() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prefix
}

// Dir is the secrets folder.
func (s *Files) Dir() string { return s.dir }

// Start writes the node's identity and the CA roots (retrying until Consul
// answers, or ctx ends), then follows them until ctx ends.
func (s *Files) Start(ctx context.Context) error {
	// The work folder above it is the node's, which replicas pass through
	// to their own folders; the secrets folder is the agent's user's alone.
	if err := os.MkdirAll(filepath.Dir(s.dir), 0o755); err != nil {
		return fmt.Errorf("secrets folder: %w", err)
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("secrets folder: %w", err)
	}
	if err := os.Chmod(s.dir, 0o700); err != nil {
		return fmt.Errorf("secrets folder: %w", err)
	}
	s.mu.Lock()
	s.ctx = ctx
	s.mu.Unlock()
	var index, rootsIndex uint64
	err := connect.Retry(ctx, s.log, "node identity", func(ctx context.Context) (err error) {
		index, err = s.writeLeaf(ctx, wire.NodeSecret, wire.NodeService(s.node), 0)
		return err
	})
	if err != nil {
		return err
	}
	s.watches.Go(func() {
		_ = consulwatch.Loop(ctx, s.log, "node identity", func(ctx context.Context, i uint64) (uint64, error) {
			return s.writeLeaf(ctx, wire.NodeSecret, wire.NodeService(s.node), max(i, index))
		})
	})
	err = connect.Retry(ctx, s.log, "CA roots", func(ctx context.Context) (err error) {
		rootsIndex, err = s.writeRoots(ctx, 0)
		return err
	})
	if err != nil {
		return err
	}
	s.watches.Go(func() {
		_ = consulwatch.Loop(ctx, s.log, "CA roots", func(ctx context.Context, i uint64) (uint64, error) {
			return s.writeRoots(ctx, max(i, rootsIndex))
		})
	})
	return nil
}

// Wait waits for every watch to end, once Start's context has ended.
func (s *Files) Wait() { s.watches.Wait() }

// AddBackend writes backend's identity, unless it is already followed,
// and follows it until Start's context ends. Call it before the node
// announces a replica of backend, whose inbound filter chain needs it.
func (s *Files) AddBackend(ctx context.Context, backend string) error {
	s.mu.Lock()
	_, followed := s.backends[backend]
	watchCtx := s.ctx
	s.mu.Unlock()
	if followed {
		return nil
	}
	if watchCtx == nil {
		return fmt.Errorf("identity of backend %s: the node's secrets are not started", backend)
	}
	name := wire.BackendSecret(backend)
	index, err := s.writeLeaf(ctx, name, wire.BackendService(backend), 0)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.backends[backend]; !ok {
		ctx, cancel := context.WithCancel(watchCtx)
		s.backends[backend] = cancel
		s.watches.Go(func() {
			_ = consulwatch.Loop(ctx, s.log, "identity of backend "+backend, func(ctx context.Context, i uint64) (uint64, error) {
				return s.writeLeaf(ctx, name, wire.BackendService(backend), max(i, index))
			})
		})
	}
	return nil
}

// Backends are the backends whose identities are followed.
func (s *Files) Backends() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.backends))
	for b := range s.backends {
		out = append(out, b)
	}
	return out
}

// RemoveBackend stops following backend's identity and deletes its file:
// call it once the node runs no replica of backend.
func (s *Files) RemoveBackend(backend string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cancel, ok := s.backends[backend]
	if !ok {
		return
	}
	cancel()
	delete(s.backends, backend)
	name := wire.BackendSecret(backend)
	delete(s.written, name)
	if err := os.Remove(wire.SecretFile(s.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("removing a backend's identity", "backend", backend, "err", err)
	}
}

// writeLeaf gets service's leaf (blocking from index) and writes it as
// secret name; it returns the answer's index.
func (s *Files) writeLeaf(ctx context.Context, name, service string, index uint64) (uint64, error) {
	cert, key, next, err := connect.Leaf(ctx, s.consul, service, index)
	if err != nil {
		return 0, err
	}
	if name == wire.NodeSecret {
		prefix, err := connect.IdentityPrefixOfPEM(cert)
		if err != nil {
			return 0, fmt.Errorf("the node's leaf: %w", err)
		}
		s.mu.Lock()
		s.prefix = prefix
		s.mu.Unlock()
	}
	data, err := envoy.CertificateSecret(name, cert, key)
	if err != nil {
		return 0, err
	}
	return next, s.write(ctx, name, data)
}

func (s *Files) writeRoots(ctx context.Context, index uint64) (uint64, error) {
	roots, next, err := connect.Roots(ctx, s.consul, index)
	if err != nil {
		return 0, err
	}
	data, err := envoy.RootsSecret(wire.RootsSecret, roots)
	if err != nil {
		return 0, err
	}
	return next, s.write(ctx, wire.RootsSecret, data)
}

// write replaces secret name's file when its content changed, unless ctx
// ended (RemoveBackend cancels it under the same lock, so a removed
// backend's file is not written again).
func (s *Files) write(ctx context.Context, name string, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	if bytes.Equal(s.written[name], data) {
		return nil
	}
	if err := envoy.ReplaceFile(wire.SecretFile(s.dir, name), data); err != nil {
		return err
	}
	if s.written[name] != nil {
		s.log.Info("secret rotated", "secret", name)
	}
	s.written[name] = data
	return nil
}

package agent

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/hashicorp/consul/api"

	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/connect"
	"github.com/servemesh/servemesh/wire"
)

// Secrets keeps a node's file-based SDS configs (wire.SecretFile) in step
// with Consul's service-mesh CA, for its Envoy: the node's identity
// (wire.NodeSecret, for xDS and for calling other nodes), the CA roots
// (wire.RootsSecret) and the identity of each backend the node runs
// replicas of (wire.BackendSecret). Each is followed with a blocking query
// and its file replaced by rename when Consul renews or re-signs it, which
// Envoy picks up without a restart. No secret reaches a replica: the folder
// is the agent's alone (0700).
type Secrets struct {
	dir    string
	consul *api.Client
	node   string
	log    *slog.Logger

	mu       sync.Mutex
	ctx      context.Context // from Start: ends every watch
	backends map[string]bool // followed
	written  map[string][]byte
}

// NewSecrets returns the secrets of node in dir (an absolute path).
func NewSecrets(dir string, consul *api.Client, node string, log *slog.Logger) *Secrets {
	return &Secrets{dir: dir, consul: consul, node: node, log: log, backends: map[string]bool{}, written: map[string][]byte{}}
}

// Dir is the secrets folder.
func (s *Secrets) Dir() string { return s.dir }

// Start writes the node's identity and the CA roots, then follows them
// until ctx ends.
func (s *Secrets) Start(ctx context.Context) error {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("secrets folder: %w", err)
	}
	if err := os.Chmod(s.dir, 0o700); err != nil {
		return fmt.Errorf("secrets folder: %w", err)
	}
	s.mu.Lock()
	s.ctx = ctx
	s.mu.Unlock()
	index, err := s.writeLeaf(ctx, wire.NodeSecret, connect.NodeService(s.node), 0)
	if err != nil {
		return err
	}
	go connect.Watch(ctx, s.log, "node identity", func(ctx context.Context, i uint64) (uint64, error) {
		return s.writeLeaf(ctx, wire.NodeSecret, connect.NodeService(s.node), max(i, index))
	})
	rootsIndex, err := s.writeRoots(ctx, 0)
	if err != nil {
		return err
	}
	go connect.Watch(ctx, s.log, "CA roots", func(ctx context.Context, i uint64) (uint64, error) {
		return s.writeRoots(ctx, max(i, rootsIndex))
	})
	return nil
}

// AddBackend writes backend's identity, unless it is already followed,
// and follows it until Start's context ends. Call it before the node
// announces a replica of backend, whose inbound filter chain needs it.
func (s *Secrets) AddBackend(ctx context.Context, backend string) error {
	s.mu.Lock()
	followed, watchCtx := s.backends[backend], s.ctx
	s.mu.Unlock()
	if followed {
		return nil
	}
	if watchCtx == nil {
		return fmt.Errorf("identity of backend %s: the node's secrets are not started", backend)
	}
	name := wire.BackendSecret(backend)
	index, err := s.writeLeaf(ctx, name, backend, 0)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.backends[backend] {
		s.backends[backend] = true
		go connect.Watch(watchCtx, s.log, "identity of backend "+backend, func(ctx context.Context, i uint64) (uint64, error) {
			return s.writeLeaf(ctx, name, backend, max(i, index))
		})
	}
	return nil
}

// writeLeaf gets service's leaf (blocking from index) and writes it as
// secret name; it returns the answer's index.
func (s *Secrets) writeLeaf(ctx context.Context, name, service string, index uint64) (uint64, error) {
	cert, key, next, err := connect.Leaf(ctx, s.consul, service, index)
	if err != nil {
		return 0, err
	}
	data, err := envoy.CertificateSecret(name, cert, key)
	if err != nil {
		return 0, err
	}
	return next, s.write(name, data)
}

func (s *Secrets) writeRoots(ctx context.Context, index uint64) (uint64, error) {
	roots, next, err := connect.Roots(ctx, s.consul, index)
	if err != nil {
		return 0, err
	}
	data, err := envoy.RootsSecret(wire.RootsSecret, roots)
	if err != nil {
		return 0, err
	}
	return next, s.write(wire.RootsSecret, data)
}

// write replaces secret name's file when its content changed.
func (s *Secrets) write(name string, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if bytes.Equal(s.written[name], data) {
		return nil
	}
	if err := envoy.WriteSecret(wire.SecretFile(s.dir, name), data); err != nil {
		return err
	}
	if s.written[name] != nil {
		s.log.Info("secret rotated", "secret", name)
	}
	s.written[name] = data
	return nil
}

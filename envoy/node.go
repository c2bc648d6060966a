package envoy

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/servemesh/servemesh/bootstrap"
)

// Node is how to run one node's Envoy: its bootstrap and its process.
type Node struct {
	// Bootstrap is the node's identity, listeners and control plane.
	Bootstrap bootstrap.Options
	// Binary is an explicit Envoy path; empty means Find's search.
	Binary string
	// WorkDir receives bootstrap.yaml and envoy.log.
	WorkDir     string
	LogLevel    string
	Concurrency int
	// Drain is how long listeners drain when Envoy stops.
	Drain  time.Duration
	Logger *slog.Logger
}

// Prepare finds and checks Envoy, renders the node's bootstrap into
// WorkDir, and returns the Config that runs it.
func (n Node) Prepare(ctx context.Context) (Config, error) {
	binary, err := Find(n.Binary)
	if err != nil {
		return Config{}, err
	}
	v, err := CheckVersion(ctx, binary)
	if err != nil {
		return Config{}, err
	}
	yaml, err := bootstrap.YAML(n.Bootstrap)
	if err != nil {
		return Config{}, err
	}
	if err := os.MkdirAll(n.WorkDir, 0o755); err != nil {
		return Config{}, fmt.Errorf("envoy work dir: %w", err)
	}
	path := filepath.Join(n.WorkDir, "bootstrap.yaml")
	if err := os.WriteFile(path, yaml, 0o644); err != nil {
		return Config{}, fmt.Errorf("write bootstrap: %w", err)
	}
	n.Logger.Info("envoy prepared", "binary", binary, "version", v, "bootstrap", path)
	return Config{
		Binary: binary, ConfigPath: path, AdminAddress: n.Bootstrap.AdminAddress,
		LogPath: filepath.Join(n.WorkDir, "envoy.log"), LogLevel: n.LogLevel,
		Concurrency: n.Concurrency, DrainTime: n.Drain, Logger: n.Logger,
	}, nil
}

// Supervise prepares the node and returns a supervisor for its Envoy that
// logs each start's readiness.
func (n Node) Supervise(ctx context.Context) (*Supervisor, error) {
	cfg, err := n.Prepare(ctx)
	if err != nil {
		return nil, err
	}
	return &Supervisor{Config: cfg, Drain: n.Drain, OnStart: func(p *Process) { go n.logReady(ctx, p) }}, nil
}

func (n Node) logReady(ctx context.Context, p *Process) {
	readyCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := p.WaitReady(readyCtx); err != nil {
		if ctx.Err() == nil {
			n.Logger.Error("envoy not ready", "pid", p.Pid(), "err", err)
		}
		return
	}
	n.Logger.Info("envoy ready", "pid", p.Pid(), "node", n.Bootstrap.Node.ID, "admin", n.Bootstrap.AdminAddress)
}

// StartReady prepares the node, starts its Envoy and waits until it is
// ready (for tests and benchmarks, which need no supervisor).
func (n Node) StartReady(ctx context.Context) (*Process, error) {
	cfg, err := n.Prepare(ctx)
	if err != nil {
		return nil, err
	}
	p, err := Start(cfg)
	if err != nil {
		return nil, err
	}
	if err := p.WaitReady(ctx); err != nil {
		_ = p.child.Kill()
		return nil, err
	}
	return p, nil
}

// Package benchenv sets up what the multi-process benchmarks run against: a
// temporary folder, the servemesh binary built into it, the real Consul
// (dev mode) and Envoy.
package benchenv

import (
	"context"
	"io"
	"os"

	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
)

// Env is one benchmark's folder, binaries and Consul.
type Env struct {
	Dir, Bin, EnvoyBin string
	Consul             *testutil.Consul
}

// Start builds servemesh into a new folder named after name, finds Envoy
// and starts Consul; Close undoes it.
func Start(ctx context.Context, name string) (*Env, error) {
	dir, err := os.MkdirTemp("", "servemesh-bench-"+name)
	if err != nil {
		return nil, err
	}
	// Replicas run as another user (nobody, for a root agent): they run the
	// binary built here and pass through to their folders below.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	e := &Env{Dir: dir}
	if e.Bin, err = testutil.BuildServemesh(ctx, dir); err == nil {
		if e.EnvoyBin, err = envoy.Find(""); err == nil {
			e.Consul, err = testutil.StartConsul(dir)
		}
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return e, nil
}

// Vars are the environment variables a servemesh child needs: where Consul
// and Envoy are.
func (e *Env) Vars() []string {
	return []string{"CONSUL_HTTP_ADDR=" + e.Consul.HTTPAddr, "SERVEMESH_ENVOY=" + e.EnvoyBin}
}

// Run starts a servemesh child with args, in this process's environment
// and Vars.
func (e *Env) Run(args ...string) (*proc.Process, error) { return e.RunEnv(nil, args...) }

// RunEnv is Run with more environment variables, env.
func (e *Env) RunEnv(env []string, args ...string) (*proc.Process, error) {
	var out io.Writer
	if os.Getenv("SERVEMESH_BENCH_LOGS") != "" {
		out = os.Stderr
	}
	vars := append(append(os.Environ(), e.Vars()...), env...)
	return proc.Start(proc.Spec{Path: e.Bin, Args: args, Env: vars, Stdout: out, Stderr: out})
}

// Close stops Consul and removes the folder.
func (e *Env) Close() {
	e.Consul.Stop()
	_ = os.RemoveAll(e.Dir)
}

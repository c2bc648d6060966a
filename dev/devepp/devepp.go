// Package devepp runs the Gateway API Inference Extension's reference
// endpoint picker (tools/gie-epp, which `make tools` builds from the
// pinned module) on a loopback port, picking among a servemesh backend's
// passing replicas as Consul lists them: the external picker of the
// Endpoint Picker Protocol's tests and benchmarks. Like devconsul, it
// fails rather than skips when the picker is missing.
package devepp

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/toolpath"
)

// Find returns gie-epp: $SERVEMESH_GIE_EPP, else .tools/bin or $PATH.
func Find() (string, error) { return toolpath.Find("gie-epp", "SERVEMESH_GIE_EPP", "") }

// Options say what the picker picks among and where it listens.
type Options struct {
	// Dir holds its log.
	Dir string
	// Consul is Consul's HTTP API (http://host:port), Service the Consul
	// service of the backend (wire.BackendService).
	Consul, Service string
	// Listen is IP:port.
	Listen string
}

// Picker is a running picker.
type Picker struct {
	// Addr is where it serves ext_proc and gRPC health, IP:port.
	Addr  string
	opts  Options
	child *proc.Process
	log   string
}

// Start starts the picker and waits until it is ready (it has read the
// catalog).
func Start(ctx context.Context, o Options) (*Picker, error) {
	p := &Picker{Addr: o.Listen, opts: o, log: filepath.Join(o.Dir, "gie-epp.log")}
	if err := p.Restart(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// Restart starts the picker again after Stop, on the same address.
func (p *Picker) Restart(ctx context.Context) error {
	bin, err := Find()
	if err != nil {
		return fmt.Errorf("the Inference Extension's endpoint picker is required (`make tools` builds it into .tools/bin): %w", err)
	}
	if err := os.MkdirAll(p.opts.Dir, 0o700); err != nil {
		return err
	}
	logFile, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer func() { _ = logFile.Close() }()
	if p.child, err = proc.Start(proc.Spec{Path: bin, Args: []string{"-listen", p.Addr, "-consul", p.opts.Consul, "-service", p.opts.Service},
		Stdout: logFile, Stderr: logFile}); err != nil {
		return fmt.Errorf("gie-epp: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		err := p.ready(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || p.child.Exited() {
			p.Stop()
			return fmt.Errorf("gie-epp at %s was not ready within 30s: %w; log:\n%s", p.Addr, err, proc.LogTail(p.log, 2048))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ready asks the picker's readiness service, as the protocol names it.
func (p *Picker) ready(ctx context.Context) error {
	conn, err := grpc.NewClient(p.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := healthgrpc.NewHealthClient(conn).Check(rctx, &healthgrpc.HealthCheckRequest{Service: "readiness"})
	if err != nil {
		return err
	}
	if resp.GetStatus() != healthgrpc.HealthCheckResponse_SERVING {
		return fmt.Errorf("readiness: %s", resp.GetStatus())
	}
	return nil
}

// Pid is the picker's process id (0: not running).
func (p *Picker) Pid() int {
	if p.child == nil || p.child.Exited() {
		return 0
	}
	return p.child.Pid()
}

// LogTail is the end of the picker's log.
func (p *Picker) LogTail() string { return proc.LogTail(p.log, 4096) }

// Stop stops the picker.
func (p *Picker) Stop() {
	if p.child != nil {
		_ = p.child.Stop(5 * time.Second)
	}
}

package main

import (
	"context"
	"embed"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"text/template"
	"time"

	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/proc"
	"github.com/servemesh/servemesh/internal/testutil"
)

//go:embed envoy-*.yaml envoy-access-log.tmpl envoy-tracing.tmpl
var baselineConfigs embed.FS

// baselineVars fill the hand-written configs' templates.
type baselineVars struct {
	Dir, Admin                           string
	PublicPort, InboundPort, ReplicaPort uint32
	GRPC                                 bool // HTTP/2 to the replica, and between the Envoys
	AccessLog                            bool // a JSON access log like servemesh's nodes'
	// Tracing, if set, traces as servemesh's traced nodes do (sampling
	// and collector; Service is set per Envoy by Traced).
	Tracing *tracedVars
}

// tracedVars fill envoy-tracing.tmpl.
type tracedVars struct {
	Host     string
	Port     uint32
	Sampling float64 // percent
	Service  string
}

// Traced is what the tracing templates need for the Envoy of service, nil
// without tracing.
func (v baselineVars) Traced(service string) *tracedVars {
	if v.Tracing == nil {
		return nil
	}
	t := *v.Tracing
	t.Service = service
	return &t
}

// accessLogVars fill envoy-access-log.tmpl for one listener.
type accessLogVars struct {
	AccessLog bool
	Listener  string
}

// Log is what the access log template needs for the listener named listener.
func (v baselineVars) Log(listener string) accessLogVars {
	return accessLogVars{AccessLog: v.AccessLog, Listener: listener}
}

// startBaseline runs the hand-written Envoys of placement (one for a
// same-node call; the caller's and the replica's node's for a cross-node
// call) and a demo replica, and returns the URL to load and a stop func.
func (b *bench) startBaseline(work, placement string, tracing *tracedVars) (string, func(), error) {
	if err := os.MkdirAll(work, 0o700); err != nil {
		return "", nil, err
	}
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	replica := testutil.MustFreeAddr("127.0.0.1")
	r, err := proc.Start(proc.Spec{Path: b.Bin, Args: b.replicaArgs(replica)})
	if err != nil {
		return "", nil, err
	}
	stops = append(stops, func() { _ = r.Stop(5 * time.Second) })
	public := testutil.MustFreeAddr("127.0.0.2")
	vars := baselineVars{Dir: work, PublicPort: testutil.Port(public), InboundPort: testutil.Port(testutil.MustFreeAddr("127.0.0.3")),
		ReplicaPort: testutil.Port(replica), GRPC: b.protocol == protoGRPC, AccessLog: !b.noAccessLog, Tracing: tracing}
	configs := []string{"envoy-same-node.yaml"}
	if placement == crossNode {
		if err := writeCerts(work); err != nil {
			stop()
			return "", nil, err
		}
		configs = []string{"envoy-cross-node-replica.yaml", "envoy-cross-node-caller.yaml"}
	}
	for i, name := range configs {
		p, err := b.startStaticEnvoy(filepath.Join(work, strconv.Itoa(i)), name, vars)
		if err != nil {
			stop()
			return "", nil, fmt.Errorf("%s: %w", name, err)
		}
		stops = append(stops, func() { _ = p.Stop(context.Background(), 0) })
	}
	return "http://" + public + "/bench", stop, nil
}

// startStaticEnvoy renders config into dir as bootstrap.yaml and runs an
// Envoy with one worker thread on it, as servemesh's nodes run in the bench.
func (b *bench) startStaticEnvoy(dir, config string, vars baselineVars) (*envoy.Process, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	vars.Admin = filepath.Join(dir, "admin.sock")
	tmpl, err := template.ParseFS(baselineConfigs, config, "envoy-access-log.tmpl", "envoy-tracing.tmpl")
	if err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(dir, "bootstrap.yaml"))
	if err != nil {
		return nil, err
	}
	err = tmpl.Execute(f, vars)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	p, err := envoy.Start(envoy.Config{Binary: b.EnvoyBin, ConfigPath: filepath.Join(dir, "bootstrap.yaml"), Dir: dir, AdminSocket: vars.Admin,
		LogPath: filepath.Join(dir, "envoy.log"), Concurrency: 1, Logger: quiet})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.WaitReady(ctx); err != nil {
		_ = p.Stop(context.Background(), 0)
		return nil, err
	}
	return p, nil
}

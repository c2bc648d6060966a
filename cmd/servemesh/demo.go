package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/controlplane/model"
	"github.com/servemesh/servemesh/envoy"
)

func runDemoReplica(ctx context.Context, log *slog.Logger, args []string, _ io.Writer) error {
	fs := newFlags("demo-replica", "--backend NAME --listen ADDR")
	backend := fs.String("backend", "", "the backend this replica belongs to")
	listen := fs.String("listen", "127.0.0.1:9001", "address to listen on")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *backend == "" {
		return errors.New("--backend is required")
	}
	fleet := newReplicaFleet(log)
	if err := fleet.start(ctx, *backend, os.Getenv("SERVEMESH_REPLICA_TAG"), *listen); err != nil {
		return err
	}
	<-ctx.Done()
	fleet.stop()
	return nil
}

// replicaFleet runs demo replicas in this process, one per address.
type replicaFleet struct {
	log      *slog.Logger
	mu       sync.Mutex
	replicas map[string]*demoreplica.Replica // by address
	servers  []*http.Server
}

func newReplicaFleet(log *slog.Logger) *replicaFleet {
	return &replicaFleet{log: log, replicas: map[string]*demoreplica.Replica{}}
}

// ensure starts a demo replica for every replica address in m not yet running.
func (f *replicaFleet) ensure(ctx context.Context, m *model.Model) error {
	for _, b := range m.Backends {
		for _, r := range b.Replicas {
			f.mu.Lock()
			_, running := f.replicas[r.Address]
			f.mu.Unlock()
			if !running {
				if err := f.start(ctx, b.Name, "", r.Address); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// start runs a demo replica named name (a fresh tag when empty) on addr.
func (f *replicaFleet) start(ctx context.Context, backend, name, addr string) error {
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("demo replica of %s: %w", backend, err)
	}
	if name == "" {
		var tag [3]byte
		_, _ = rand.Read(tag[:])
		name = backend + "#" + hex.EncodeToString(tag[:])
	}
	r := &demoreplica.Replica{Backend: backend, Name: name}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	f.mu.Lock()
	f.replicas[addr] = r
	f.servers = append(f.servers, srv)
	f.mu.Unlock()
	f.log.Info("demo replica serving", "backend", backend, "replica", r.Name, "address", addr)
	return nil
}

// counts returns requests served per backend, as "backend=n" sorted.
func (f *replicaFleet) counts() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	per := map[string]int64{}
	for _, r := range f.replicas {
		per[r.Backend] += r.Served()
	}
	var parts []string
	for b, n := range per {
		parts = append(parts, fmt.Sprintf("%s=%d", b, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func (f *replicaFleet) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.servers {
		_ = s.Close()
	}
}

func runDemo(ctx context.Context, log *slog.Logger, args []string, stdout io.Writer) error {
	var cpo controlPlaneOptions
	var eo envoyOptions
	fs := newFlags("demo", "[flags]")
	cpo.register(fs)
	eo.register(fs)
	if err := fs.Set("config", "examples/demo.yaml"); err != nil {
		return err
	}
	for name, value := range map[string]string{"public": "127.0.0.1:8080", "node-id": "demo-node", "work-dir": ".run/demo"} {
		if err := fs.Set(name, value); err != nil {
			return err
		}
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fleet := newReplicaFleet(log.With("component", "replicas"))
	defer fleet.stop()
	cpo.beforeApply = func(m *model.Model) error { return fleet.ensure(ctx, m) }
	cp, err := startControlPlane(ctx, log, cpo)
	if err != nil {
		return err
	}
	defer cp.stop()
	eo.node.xds = cp.xdsAddr
	sup, err := eo.prepare(ctx, log.With("component", "envoy"))
	if err != nil {
		return err
	}
	ready := make(chan error, 1)
	sup.OnStart = func(p *envoy.Process) {
		go func() {
			readyCtx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			ready <- p.WaitReady(readyCtx)
		}()
	}
	supDone := make(chan error, 1)
	go func() { supDone <- sup.Run(ctx) }()
	select {
	case err := <-ready:
		if err != nil {
			return err
		}
	case err := <-supDone:
		return err
	}
	printDemoHelp(stdout, cpo.configPath, eo.node, cp.httpAddr)
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	last := ""
	for {
		select {
		case <-ctx.Done():
			return <-supDone
		case err := <-supDone:
			return err
		case <-tick.C:
			if c := fleet.counts(); c != last {
				log.Info("requests served so far (mirrored ones included)", "by_backend", c)
				last = c
			}
		}
	}
}

func printDemoHelp(w io.Writer, config string, node nodeOptions, httpAddr string) {
	fmt.Fprintf(w, `
servemesh demo is running: control plane, Envoy node %q, demo replicas.
Config: %s (edit and save it: the change is served in well under a second).

Try:
  curl -s http://%[3]s/model                       # 90%% model-v1, 10%% model-v2; 20%% also mirrored to model-v3-candidate
  for i in $(seq 200); do curl -s http://%[3]s/model -o /dev/null -w '%%{header_json}\n' | grep -o 'model-v[0-9a-z-]*'; done | sort | uniq -c
  curl -si -X DELETE http://%[3]s/model            # 405, with an Allow header
  curl -si http://%[3]s/embeddings                 # 404: a headless endpoint is not public
  curl -s -H 'Host: embeddings' http://%[4]s/      # ...but the mesh listener serves it by Host
  curl -s http://%[5]s/v1/xds/nodes                # which config each node has ACKed
  curl -s http://%[5]s/metrics | grep servemesh_   # control-plane metrics
  curl -s http://%[6]s/stats | grep 'cluster.model-v.*upstream_rq_total'   # Envoy's own counts

Press Ctrl-C to stop.
`, node.id, config, node.public, node.mesh, httpAddr, node.admin)
}

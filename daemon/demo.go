package daemon

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/servemesh/servemesh/agent/demoreplica"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/rungroup"
	"github.com/servemesh/servemesh/meshspec"
)

// DemoOptions configure `servemesh demo`: a file-mode control plane, one
// Envoy and the file's replicas as demo replicas in this process.
type DemoOptions struct {
	Plane FilePlaneOptions
	// Envoy is the node; its control-plane address is the plane's.
	Envoy envoy.Launcher
}

// RunDemo runs the file-mode demo until ctx ends, printing what to try:
// the plane, the node's Envoy and the demo's reporting in one run group.
func RunDemo(ctx context.Context, log *slog.Logger, o DemoOptions, stdout io.Writer) error {
	fleet := demoreplica.NewFleet(log.With("component", "replicas"))
	defer fleet.Stop()
	o.Plane.BeforeApply = func(m *meshspec.Model) error { return fleet.Ensure(ctx, m) }
	plane, err := OpenFilePlane(ctx, log, o.Plane)
	if err != nil {
		return err
	}
	o.Envoy.Bootstrap.XDSAddress = plane.XDSAddr()
	cfg, err := o.Envoy.Prepare(ctx)
	if err != nil {
		return err
	}
	g, gctx := rungroup.New(ctx)
	ready := make(chan error, 1)
	var waits sync.WaitGroup // each started Envoy's wait for ready, joined below
	defer waits.Wait()
	sup := &envoy.Supervisor{Config: cfg, Drain: o.Envoy.Drain, OnStart: func(p *envoy.Process) {
		waits.Go(func() {
			readyCtx, cancel := context.WithTimeout(gctx, time.Minute)
			defer cancel()
			select {
			case ready <- p.WaitReady(readyCtx):
			default: // a restarted Envoy: the demo already printed its help
			}
		})
	}}
	g.Go("plane", plane.Run)
	g.Go("envoy", sup.Run)
	g.Go("demo", func(ctx context.Context) error {
		select {
		case err := <-ready:
			if err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
		printDemoHelp(stdout, o, plane.HTTPAddr())
		logCounts(ctx, log, fleet)
		return nil
	})
	return g.Wait()
}

// logCounts logs the requests each backend served, every 10 seconds when
// they changed, until ctx ends.
func logCounts(ctx context.Context, log *slog.Logger, fleet *demoreplica.Fleet) {
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	last := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if c := fleet.Counts(); c != last {
				log.Info("requests served so far (mirrored ones included)", "by_backend", c)
				last = c
			}
		}
	}
}

func printDemoHelp(w io.Writer, o DemoOptions, httpAddr string) {
	node := o.Envoy.Bootstrap.Node
	public := fmt.Sprintf("%s:%d", node.PublicAddress, node.PublicPort)
	mesh := fmt.Sprintf("%s:%d", node.MeshAddress, node.MeshPort)
	fmt.Fprintf(w, `
servemesh demo is running: control plane, Envoy node %q, demo replicas.
Config: %s (edit and save it: the change is served in well under a second).

Try:
  curl -s http://%[3]s/model                       # 90%% model-v1, 10%% model-v2; 20%% also mirrored to model-v3-candidate
  for i in $(seq 200); do curl -s http://%[3]s/model -o /dev/null -w '%%header{x-servemesh-backend}\n'; done | sort | uniq -c
  curl -si -X DELETE http://%[3]s/model            # 405, with an Allow header
  curl -si http://%[3]s/embeddings                 # 404: a headless endpoint is not public
  curl -s -H 'Host: embeddings' http://%[4]s/      # ...but the mesh listener serves it by Host
  curl -s http://%[5]s/v1/xds/nodes                # which config each node has ACKed
  curl -s http://%[5]s/metrics | grep servemesh_   # control-plane metrics
  curl -s --unix-socket %[6]s http://envoy/stats | grep 'cluster.model-v.*upstream_rq_total'   # Envoy's own counts (its admin API)

Press Ctrl-C to stop.
`, node.ID, o.Plane.ConfigPath, public, mesh, httpAddr, o.Envoy.AdminSocket())
}

// RunDemoReplica runs one demo replica (what the demo stack's agent starts
// as a process) until ctx ends.
func RunDemoReplica(ctx context.Context, log *slog.Logger, backend, tag, listen string, grpc bool, startDelay time.Duration) error {
	if backend == "" {
		return fmt.Errorf("--backend is required")
	}
	if startDelay > 0 { // a model server loading its weights
		log.Info("demo replica starting", "backend", backend, "listening_in", startDelay)
		select {
		case <-time.After(startDelay):
		case <-ctx.Done():
			return nil
		}
	}
	if grpc {
		l, err := (&net.ListenConfig{}).Listen(ctx, "tcp", listen)
		if err != nil {
			return fmt.Errorf("demo replica: %w", err)
		}
		log.Info("demo replica serving gRPC", "backend", backend, "listen", l.Addr().String())
		return demoreplica.ServeGRPC(ctx, l, backend, cmp.Or(tag, backend))
	}
	return demoreplica.NewFleet(log).Serve(ctx, backend, tag, listen)
}

// ModelServerOptions configure RunModelServer.
type ModelServerOptions struct {
	Backend, Tag, Listen string
	Slots                int
	Service              time.Duration
	// SlowLock, if set, is a file the first replica to create it takes:
	// that one is SlowFactor times slower than the others, and reports
	// FakeWaiting more requests waiting than it has.
	SlowLock    string
	SlowFactor  float64
	FakeWaiting int
	// ForgeReport makes the replica that takes SlowLock send load reports
	// of its own (demoreplica.ModelServer.ForgeReport); Hang makes it
	// stall (demoreplica.ModelServer.Hang).
	ForgeReport, Hang bool
	// TokenInterval is the time between a streamed answer's tokens.
	TokenInterval time.Duration
	// PrefillPerBlock and CacheBlocks give it a prefix cache
	// (demoreplica.ModelServer's).
	PrefillPerBlock time.Duration
	CacheBlocks     int
	// ModelsPerReplica and ModelLoad have it load models on demand.
	ModelsPerReplica int
	ModelLoad        time.Duration
}

// RunModelServer runs one stand-in model server (demoreplica.ModelServer)
// until ctx ends.
func RunModelServer(ctx context.Context, log *slog.Logger, o ModelServerOptions) error {
	if o.Backend == "" {
		return fmt.Errorf("--backend is required")
	}
	s := &demoreplica.ModelServer{Backend: o.Backend, Name: cmp.Or(o.Tag, o.Backend), Slots: o.Slots, Service: o.Service, Slowdown: 1,
		PrefillPerBlock: o.PrefillPerBlock, CacheBlocks: o.CacheBlocks, ModelsPerReplica: o.ModelsPerReplica, ModelLoad: o.ModelLoad,
		TokenInterval: o.TokenInterval}
	if o.SlowLock != "" {
		if f, err := os.OpenFile(o.SlowLock, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644); err == nil {
			_, _ = fmt.Fprintln(f, s.Name)
			_ = f.Close()
			s.Slowdown, s.FakeWaiting, s.Odd, s.ForgeReport, s.Hang = o.SlowFactor, o.FakeWaiting, true, o.ForgeReport, o.Hang
		}
	}
	l, err := (&net.ListenConfig{}).Listen(ctx, "tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("model server: %w", err)
	}
	log.Info("model server serving", "backend", o.Backend, "listen", l.Addr().String(), "slots", o.Slots, "service", o.Service, "slowdown", s.Slowdown, "fake_waiting", s.FakeWaiting)
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	if err := rungroup.Serve(ctx, func() error { return srv.Serve(l) }, func() { _ = srv.Close() }); err != nil {
		return fmt.Errorf("model server: %w", err)
	}
	return nil
}

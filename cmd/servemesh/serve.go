package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/servemesh/servemesh/controlplane/configfile"
	"github.com/servemesh/servemesh/controlplane/model"
	"github.com/servemesh/servemesh/xds/server"
)

type controlPlaneOptions struct {
	configPath string
	xdsListen  string
	httpListen string
	// beforeApply, if set, sees every valid model before it is served; an
	// error refuses the model.
	beforeApply func(*model.Model) error
}

func (o *controlPlaneOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.configPath, "config", "", "the mesh config file (YAML); changes are applied when it is saved")
	fs.StringVar(&o.xdsListen, "xds-listen", "127.0.0.1:18000", "address of the xDS gRPC server Envoy nodes connect to")
	fs.StringVar(&o.httpListen, "http-listen", "127.0.0.1:18001", "address of the HTTP server for /metrics, /healthz and /v1/xds/nodes")
}

func runServe(ctx context.Context, log *slog.Logger, args []string, _ io.Writer) error {
	var o controlPlaneOptions
	fs := newFlags("serve", "--config FILE [flags]")
	o.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if o.configPath == "" {
		return errors.New("--config is required: name the mesh config file to serve")
	}
	cp, err := startControlPlane(ctx, log, o)
	if err != nil {
		return err
	}
	<-ctx.Done()
	cp.stop()
	return nil
}

// planeServers are the xDS gRPC server and the HTTP server (metrics, health,
// node status, and the API when there is one) every control plane runs.
type planeServers struct {
	xds       *server.Server
	reg       *prometheus.Registry
	mux       *http.ServeMux
	grpc      *grpc.Server
	http      *http.Server
	xdsAddr   string
	httpAddr  string
	cancelRun context.CancelFunc
}

// startServers listens on both addresses and starts serving; the caller adds
// its own handlers to mux before requests arrive on them.
func startServers(ctx context.Context, log *slog.Logger, xdsListen, httpListen string) (*planeServers, error) {
	reg := newRegistry()
	xds := server.New(server.Options{Logger: log.With("component", "xds"), Registerer: reg})
	var lc net.ListenConfig
	xdsLis, err := lc.Listen(ctx, "tcp", xdsListen)
	if err != nil {
		return nil, fmt.Errorf("xds listener: %w", err)
	}
	httpLis, err := lc.Listen(ctx, "tcp", httpListen)
	if err != nil {
		_ = xdsLis.Close()
		return nil, fmt.Errorf("http listener: %w", err)
	}
	g := grpc.NewServer(
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 5 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 15 * time.Second, PermitWithoutStream: true}),
	)
	xds.Register(g)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /v1/xds/nodes", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(xds.Status())
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	runCtx, cancel := context.WithCancel(ctx)
	go xds.Run(runCtx)
	go func() {
		if err := g.Serve(xdsLis); err != nil {
			log.Error("xds server stopped", "err", err)
		}
	}()
	go func() {
		if err := hs.Serve(httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "err", err)
		}
	}()
	return &planeServers{xds: xds, reg: reg, mux: mux, grpc: g, http: hs, xdsAddr: xdsLis.Addr().String(),
		httpAddr: httpLis.Addr().String(), cancelRun: cancel}, nil
}

// newRegistry returns a Prometheus registry with the Go and process collectors.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// serveMetrics serves /metrics from reg on addr until the returned stop is called.
// It returns the address it listens on and a stop function.
func serveMetrics(ctx context.Context, log *slog.Logger, addr string, reg *prometheus.Registry, extra map[string]http.HandlerFunc) (string, func(), error) {
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	for pattern, h := range extra {
		mux.HandleFunc(pattern, h)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := hs.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	return lis.Addr().String(), func() { _ = hs.Close() }, nil
}

func (ps *planeServers) stop() {
	ps.cancelRun()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = ps.http.Shutdown(ctx)
	stopped := make(chan struct{})
	go func() { ps.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		ps.grpc.Stop() // xDS streams never end on their own
	}
}

// controlPlane is a running xDS server fed by a config file.
type controlPlane struct {
	*planeServers
}

// startControlPlane loads the config file (refusing to start on an invalid
// one), starts the servers and the file watcher.
func startControlPlane(ctx context.Context, log *slog.Logger, o controlPlaneOptions) (*controlPlane, error) {
	m, sum, err := configfile.LoadForWatch(o.configPath)
	if err != nil {
		return nil, err
	}
	ps, err := startServers(ctx, log, o.xdsListen, o.httpListen)
	if err != nil {
		return nil, err
	}
	apply := func(m *model.Model) error {
		if o.beforeApply != nil {
			if err := o.beforeApply(m); err != nil {
				return err
			}
		}
		return ps.xds.SetModel(m)
	}
	if err := apply(m); err != nil {
		ps.stop()
		return nil, err
	}
	w := &configfile.Watcher{Path: o.configPath, Apply: apply, Logger: log.With("component", "configfile")}
	runCtx, cancel := context.WithCancel(ctx)
	go w.Run(runCtx, sum)
	inner := ps.cancelRun
	ps.cancelRun = func() { cancel(); inner() }
	log.Info("control plane serving", "config", o.configPath, "xds", ps.xdsAddr, "http", ps.httpAddr)
	return &controlPlane{ps}, nil
}

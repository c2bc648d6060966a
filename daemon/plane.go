package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/servemesh/servemesh/controlplane/api"
	"github.com/servemesh/servemesh/internal/httpserver"
	"github.com/servemesh/servemesh/internal/rungroup"
	"github.com/servemesh/servemesh/xds/server"
)

// The xDS listener's limits (docs/limits.md). An Envoy opens one
// connection with one ADS stream; requests are small (a node, resource
// names, versions), answers are not bounded here.
const (
	MaxXDSConnections          = 4096
	MaxXDSStreamsPerConnection = 8
	MaxXDSRequestBytes         = 1 << 20
)

// Plane is what every control plane runs: the xDS server on a gRPC
// listener, and an HTTP listener with /metrics, /healthz, /v1/xds/nodes
// and whatever the caller adds to Mux before it starts.
type Plane struct {
	XDS      *server.Server
	Registry *prometheus.Registry
	Mux      *http.ServeMux

	grpc    *grpc.Server
	xdsLis  net.Listener
	http    *httpserver.Server
	xdsAddr string
	wrap    func(http.Handler) http.Handler
	xdsTLS  *tls.Config
	httpTLS *tls.Config
}

// ServeXDSOverTLS makes the xDS server require TLS with client
// certificates (call before Start).
func (p *Plane) ServeXDSOverTLS(cfg *tls.Config) { p.xdsTLS = cfg }

// ServeHTTPOverTLS makes the HTTP listener (the API) serve HTTPS with cfg;
// call before Start.
func (p *Plane) ServeHTTPOverTLS(cfg *tls.Config) { p.httpTLS = cfg }

// NewPlane builds the xDS server and the HTTP mux; Listen binds them and
// Run serves them. cacheOff turns translation's reuse off
// (server.Options.CacheOff).
func NewPlane(log *slog.Logger, cacheOff bool) *Plane {
	reg := httpserver.NewRegistry()
	xds := server.New(server.Options{Logger: log.With("component", "xds"), Registerer: reg, CacheOff: cacheOff})
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.Handle("GET /v1/xds/nodes", api.NodesHandler(xds.Status))
	return &Plane{XDS: xds, Registry: reg, Mux: mux}
}

// Listen binds both addresses; Run serves them.
func (p *Plane) Listen(ctx context.Context, xdsListen, httpListen string) error {
	var lc net.ListenConfig
	xdsLis, err := lc.Listen(ctx, "tcp", xdsListen)
	if err != nil {
		return fmt.Errorf("xds listener: %w", err)
	}
	var h http.Handler = p.Mux
	if p.wrap != nil {
		h = p.wrap(h)
	}
	if p.http, err = httpserver.Listen(ctx, httpListen, h, httpserver.DefaultLimits, p.httpTLS); err != nil {
		_ = xdsLis.Close()
		return err
	}
	p.xdsLis = netutil.LimitListener(xdsLis, MaxXDSConnections)
	opts := []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 5 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 15 * time.Second, PermitWithoutStream: true}),
		grpc.MaxConcurrentStreams(MaxXDSStreamsPerConnection),
		grpc.MaxRecvMsgSize(MaxXDSRequestBytes),
		grpc.ConnectionTimeout(10 * time.Second),
	}
	if p.xdsTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(p.xdsTLS)))
	}
	opts = append(opts, grpc.ForceServerCodecV2(server.Codec()))
	p.grpc = grpc.NewServer(opts...)
	p.XDS.Register(p.grpc)
	p.xdsAddr = p.xdsLis.Addr().String()
	return nil
}

// Run serves xDS and HTTP, and publishes each accepted change, until ctx
// ends or one of the three fails; it returns when all three stopped.
func (p *Plane) Run(ctx context.Context) error {
	g, _ := rungroup.New(ctx)
	g.Go("xds publisher", p.XDS.Run)
	g.Go("xds server", func(ctx context.Context) error {
		return rungroup.Serve(ctx, func() error { return p.grpc.Serve(p.xdsLis) }, p.stopXDS)
	})
	g.Go("http server", p.http.Serve)
	return g.Wait()
}

// stopXDS ends the xDS server; its streams, which never end on their own,
// are cut after 2 seconds.
func (p *Plane) stopXDS() {
	stopped := make(chan struct{})
	go func() { p.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		p.grpc.Stop()
		<-stopped
	}
}

// Wrap puts middleware around every HTTP path of the plane (call before
// Start): the controller's authentication.
func (p *Plane) Wrap(mw func(http.Handler) http.Handler) { p.wrap = mw }

// XDSAddr is the address the xDS server listens on.
func (p *Plane) XDSAddr() string { return p.xdsAddr }

// HTTPAddr is the address the HTTP server listens on.
func (p *Plane) HTTPAddr() string { return p.http.Addr() }

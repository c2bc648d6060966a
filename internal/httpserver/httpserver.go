// Package httpserver serves every HTTP listener servemesh opens (the
// controller's API, the file-mode control plane's status, an agent's status
// listener) with the same limits, so none can be held open forever by a
// slow or idle client, and serves HTTPS from certificate files it reloads
// when they are replaced (CertFiles).
package httpserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/net/netutil"

	"github.com/servemesh/servemesh/internal/rungroup"
)

// Limits bound what one client can hold of a server.
type Limits struct {
	// ReadHeader and Read bound reading a request's headers and all of
	// it; Write bounds a request from its headers to its answer; Idle
	// closes a keep-alive connection with no request.
	ReadHeader, Read, Write, Idle time.Duration
	MaxHeaderBytes                int
	// MaxConnections bounds open connections; more wait to be accepted.
	MaxConnections int
}

// DefaultLimits are the limits of every servemesh HTTP server
// (docs/limits.md). The longest request is a large apply, whose commit is
// bounded at two minutes.
var DefaultLimits = Limits{ReadHeader: 5 * time.Second, Read: 20 * time.Second, Write: 150 * time.Second,
	Idle: 30 * time.Second, MaxHeaderBytes: 64 << 10, MaxConnections: 512}

// Server is an HTTP server listening on one address: Listen binds it,
// Serve serves it until its context ends.
type Server struct {
	hs   *http.Server
	lis  net.Listener
	addr string

	// stop is StartLimited's: it ends its own serving.
	stop func()
}

// Listen binds addr (port 0 picks one) for h, within l, serving HTTPS with
// cfg when it is not nil; Serve serves it.
func Listen(ctx context.Context, addr string, h http.Handler, l Limits, cfg *tls.Config) (*Server, error) {
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	lis = netutil.LimitListener(lis, l.MaxConnections)
	if cfg != nil {
		lis = tls.NewListener(lis, cfg)
	}
	return &Server{lis: lis, addr: lis.Addr().String(), hs: &http.Server{
		Handler: h, ReadHeaderTimeout: l.ReadHeader, ReadTimeout: l.Read, WriteTimeout: l.Write,
		IdleTimeout: l.Idle, MaxHeaderBytes: l.MaxHeaderBytes,
	}}, nil
}

// Serve serves until ctx ends, then lets requests in progress finish for
// up to 2 seconds and closes; it returns the error that stopped serving
// before that, if one did.
func (s *Server) Serve(ctx context.Context) error {
	return rungroup.Serve(ctx, func() error {
		if err := s.hs.Serve(s.lis); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http server on %s: %w", s.addr, err)
		}
		return nil
	}, s.shutdown)
}

func (s *Server) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.hs.Shutdown(ctx); err != nil {
		_ = s.hs.Close()
	}
}

// Start listens on addr (port 0 picks one) and serves h, within
// DefaultLimits, until Stop: Listen and Serve for a caller with no run
// group (tests, benchmarks).
func Start(ctx context.Context, log *slog.Logger, addr string, h http.Handler) (*Server, error) {
	return StartLimited(ctx, log, addr, h, DefaultLimits)
}

// StartLimited is Start with other limits.
func StartLimited(ctx context.Context, log *slog.Logger, addr string, h http.Handler, l Limits) (*Server, error) {
	s, err := Listen(ctx, addr, h, l, nil)
	if err != nil {
		return nil, err
	}
	s.stop = rungroup.Background(ctx, s.Serve, func(err error) { log.Error("http server stopped", "addr", s.addr, "err", err) })
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.addr }

// Stop ends what Start began: requests in progress get up to 2 seconds.
func (s *Server) Stop() { s.stop() }

// NewRegistry returns a Prometheus registry with the Go and process
// collectors, the base of every servemesh process's /metrics.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Package httpserver serves every HTTP listener servemesh opens (the
// controller's API, the file-mode control plane's status, an agent's status
// listener) with the same limits, so none can be held open forever by a
// slow or idle client.
package httpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// The limits of every servemesh HTTP server.
const (
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 30 * time.Second
	IdleTimeout       = 60 * time.Second
	MaxHeaderBytes    = 64 << 10
)

// Server is an HTTP server listening on one address.
type Server struct {
	hs   *http.Server
	addr string
	done chan struct{}
}

// Start listens on addr (port 0 picks one) and serves h until Stop.
func Start(ctx context.Context, log *slog.Logger, addr string, h http.Handler) (*Server, error) {
	var lc net.ListenConfig
	lis, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	s := &Server{addr: lis.Addr().String(), done: make(chan struct{}), hs: &http.Server{
		Handler: h, ReadHeaderTimeout: ReadHeaderTimeout, ReadTimeout: ReadTimeout,
		IdleTimeout: IdleTimeout, MaxHeaderBytes: MaxHeaderBytes,
	}}
	go func() {
		defer close(s.done)
		if err := s.hs.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "addr", s.addr, "err", err)
		}
	}()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.addr }

// Stop lets requests in progress finish for up to 2 seconds, then closes.
func (s *Server) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.hs.Shutdown(ctx); err != nil {
		_ = s.hs.Close()
	}
	<-s.done
}

// NewRegistry returns a Prometheus registry with the Go and process
// collectors, the base of every servemesh process's /metrics.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Package rungroup runs the components of one daemon as one unit, in
// errgroup's shape: every component runs until the daemon's context ends;
// the first to fail, or to stop while the daemon still runs, cancels the
// others; Wait joins every one of them and says which stopped first and
// why. It is off the flow of docs/architecture.md: daemon runs
// each daemon's components with it.
package rungroup

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
)

// Group is one daemon's running components. Make it with New.
type Group struct {
	g   *errgroup.Group
	ctx context.Context

	mu    sync.Mutex
	first string // the component that stopped first, while the daemon ran
}

// New returns a group whose components run under ctx, and the context
// they get: it ends when ctx does or when any component stops.
func New(ctx context.Context) (*Group, context.Context) {
	g, gctx := errgroup.WithContext(ctx)
	return &Group{g: g, ctx: gctx}, gctx
}

// Go runs component name until it returns. It gets the group's context;
// it should return when that ends (nil, or an error wrapping
// context.Canceled). A component that returns before then, with or without
// an error, stops the daemon.
func (g *Group) Go(name string, run func(ctx context.Context) error) {
	g.g.Go(func() error {
		err := run(g.ctx)
		if g.ctx.Err() != nil && (err == nil || errors.Is(err, context.Canceled)) {
			return nil // the daemon is stopping: a clean stop
		}
		g.mu.Lock()
		if g.first == "" {
			g.first = name
		}
		g.mu.Unlock()
		if err == nil {
			return fmt.Errorf("%s stopped while the daemon ran", name)
		}
		return fmt.Errorf("%s: %w", name, err)
	})
}

// Wait waits for every component to return and returns the first error:
// nil when they all stopped because the daemon's context ended.
func (g *Group) Wait() error { return g.g.Wait() }

// Stopped names the component that stopped the daemon, or "".
func (g *Group) Stopped() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.first
}

// Serve runs serve (a server's blocking Serve) until it returns or ctx
// ends; then it calls stop and waits for serve to return. An error serve
// returns before ctx ended is returned, one after it (a closed listener)
// is not: the one serve-until-done of every HTTP and gRPC server.
func Serve(ctx context.Context, serve func() error, stop func()) error {
	served := make(chan error, 1)
	go func() { served <- serve() }()
	select {
	case err := <-served:
		switch {
		case ctx.Err() != nil:
			return nil //nolint:nilerr // a server closed as its daemon stops: a clean stop
		case err == nil:
			return errors.New("the server stopped serving")
		}
		return err
	case <-ctx.Done():
		stop()
		<-served //nolint:errcheck // what a closed server says as it stops is no failure
		return nil
	}
}

// ServeGRPC is Serve for gRPC server srv on l, which srv.Stop ends.
func ServeGRPC(ctx context.Context, srv *grpc.Server, l net.Listener) error {
	return Serve(ctx, func() error {
		if err := srv.Serve(l); !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	}, srv.Stop)
}

// Background runs run in a goroutine of its own until the returned stop is
// called, which ends run's context and waits for it; an error run returns
// goes to report. It is for callers with no run group (tests, benchmarks):
// run's context does not end with ctx, only with stop.
func Background(ctx context.Context, run func(context.Context) error, report func(error)) (stop func()) {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := run(runCtx); err != nil {
			report(err)
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

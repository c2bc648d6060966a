package rungroup

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestFirstFailureStopsTheRest: a component that fails cancels the others,
// Wait joins them all and names the one that failed.
func TestFirstFailureStopsTheRest(t *testing.T) {
	defer goleak.VerifyNone(t)
	g, _ := New(context.Background())
	stopped := make(chan string, 2)
	for _, name := range []string{"catalog", "publisher"} {
		g.Go(name, func(ctx context.Context) error {
			<-ctx.Done()
			stopped <- name
			return ctx.Err()
		})
	}
	g.Go("xds", func(context.Context) error { return errors.New("listener closed") })
	err := g.Wait()
	if err == nil || err.Error() != "xds: listener closed" || g.Stopped() != "xds" {
		t.Fatalf("Wait: %v, stopped by %q; want xds's error", err, g.Stopped())
	}
	if len(stopped) != 2 {
		t.Fatalf("%d of the 2 other components stopped", len(stopped))
	}
}

// TestAComponentThatReturnsEarlyStopsTheDaemon: returning nil while the
// daemon runs is a stop too (a watcher whose loop ended would otherwise
// leave the daemon running without it).
func TestAComponentThatReturnsEarlyStopsTheDaemon(t *testing.T) {
	defer goleak.VerifyNone(t)
	g, ctx := New(context.Background())
	g.Go("watcher", func(context.Context) error { return nil })
	g.Go("server", func(ctx context.Context) error { <-ctx.Done(); return nil })
	if err := g.Wait(); err == nil || !strings.Contains(err.Error(), "watcher stopped while the daemon ran") {
		t.Fatalf("Wait: %v", err)
	}
	if ctx.Err() == nil {
		t.Fatal("the group's context did not end")
	}
}

// TestTheDaemonsEndIsCleanStop: when the daemon's context ends, components
// that return nil or context.Canceled stop cleanly.
func TestTheDaemonsEndIsCleanStop(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx, cancel := context.WithCancel(context.Background())
	g, _ := New(ctx)
	g.Go("a", func(ctx context.Context) error { <-ctx.Done(); return nil })
	g.Go("b", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	cancel()
	if err := g.Wait(); err != nil || g.Stopped() != "" {
		t.Fatalf("Wait after the daemon's end: %v (stopped by %q)", err, g.Stopped())
	}
}

// TestServe: a server that fails is reported; at ctx's end it is stopped
// and waited for.
func TestServe(t *testing.T) {
	defer goleak.VerifyNone(t)
	if err := Serve(context.Background(), func() error { return errors.New("bind: in use") }, func() {}); err == nil || err.Error() != "bind: in use" {
		t.Fatalf("Serve of a failing server: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	go func() { time.Sleep(10 * time.Millisecond); cancel() }()
	err := Serve(ctx, func() error { <-release; return errors.New("use of closed listener") }, func() { close(release) })
	if err != nil {
		t.Fatalf("Serve stopped at its context's end: %v", err)
	}
}

// TestBackground: run outlives its caller's context and ends with stop,
// which waits for it; a failure is reported.
func TestBackground(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	stop := Background(ctx, func(ctx context.Context) error { <-ctx.Done(); close(ended); return nil }, func(err error) { t.Errorf("reported %v", err) })
	cancel()
	select {
	case <-ended:
		t.Fatal("run ended with its caller's context, not with stop")
	case <-time.After(20 * time.Millisecond):
	}
	stop()
	select {
	case <-ended:
	default:
		t.Fatal("stop returned before run ended")
	}
	reported := make(chan error, 1)
	stop = Background(context.Background(), func(context.Context) error { return errors.New("bind: in use") }, func(err error) { reported <- err })
	stop()
	if err := <-reported; err == nil || err.Error() != "bind: in use" {
		t.Fatalf("reported %v", err)
	}
}

package activator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/servemesh/servemesh/agent/nodeview"
	"github.com/servemesh/servemesh/envoy"
	"github.com/servemesh/servemesh/internal/testutil"
	"github.com/servemesh/servemesh/meshspec"
	"github.com/servemesh/servemesh/wire"
)

// membershipAdmin is a fake Envoy admin API whose clusters have the healthy
// hosts healthy says (each also has the activator, DEGRADED).
func membershipAdmin(t *testing.T, healthy *atomic.Int64) envoy.Admin {
	t.Helper()
	return envoy.Admin{Socket: testutil.UnixServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		filter := r.URL.Query().Get("filter")
		name := strings.TrimPrefix(strings.Split(filter, `\.membership_`)[0], "^")
		name = strings.ReplaceAll(name, `\.`, ".")
		_, _ = fmt.Fprintf(w, `{"stats": [{"name": "%[1]s.membership_healthy", "value": %[2]d}, {"name": "%[1]s.membership_degraded", "value": 1}]}`,
			name, healthy.Load())
	}))}
}

// startActivator serves an activator for m in a folder of its own and
// returns clients of its two sockets.
func startActivator(t *testing.T, m *meshspec.Model, healthy *atomic.Int64) (a *Activator, backends, inbound *http.Client) {
	t.Helper()
	view := nodeview.New(m, "n1")
	a = New(Options{Admin: membershipAdmin(t, healthy), Node: "n1", Desired: func() *nodeview.View { return view },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: prometheus.NewRegistry()})
	a.poll = 10 * time.Millisecond
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- a.Serve(ctx, dir) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	})
	client := func(socket string) *http.Client {
		return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", filepath.Join(dir, socket))
		}}}
	}
	testutil.WaitFor(t, 5*time.Second, "the activator's sockets", func() bool {
		resp, err := client(wire.ActivatorSocket).Get("http://activator/") //nolint:noctx // test
		if err == nil {
			_ = resp.Body.Close()
		}
		return err == nil
	})
	return a, client(wire.ActivatorSocket), client(wire.ActivatorInboundSocket)
}

// held sends a request for backend and returns the answer's status, whether
// it said the request reached no replica (retried by Envoy), and its body.
func held(t *testing.T, c *http.Client, backend string) (int, bool, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://activator/predict", strings.NewReader("payload"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(wire.BackendHeader, backend)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get(wire.UnreachedHeader) != "", string(body)
}

func TestActivatorHoldsUntilAReplicaIsReady(t *testing.T) {
	run := &meshspec.ProcessSpec{Command: "/srv/model"}
	m := &meshspec.Model{Backends: []meshspec.Backend{
		{Name: "model", Process: run, Config: meshspec.BackendConfig{HoldTimeoutS: 5}},
		{Name: "brief", Process: run, Config: meshspec.BackendConfig{HoldTimeoutS: 0.2}},
		{Name: "small", Process: run, Config: meshspec.BackendConfig{HoldTimeoutS: 5, MaxHeld: 2}},
		{Name: "here", Process: run, Placements: []meshspec.Placement{{Tag: "here#1", Node: "n1", State: meshspec.Running}}},
		{Name: "elsewhere", Process: run, Placements: []meshspec.Placement{{Tag: "elsewhere#1", Node: "n2", State: meshspec.Running}}},
		{Name: "static", Config: meshspec.BackendConfig{HoldTimeoutS: 5}},
	}}
	var healthy atomic.Int64
	a, backends, inbound := startActivator(t, m, &healthy)

	t.Run("a static or external backend is answered 503 at once: no replica of it is servemesh's to start", func(t *testing.T) {
		start := time.Now()
		status, retried, body := held(t, backends, "static")
		if status != http.StatusServiceUnavailable || retried || !strings.Contains(body, "not servemesh's to start") || time.Since(start) > time.Second {
			t.Fatalf("answer %d (retried %v) %q after %v; want a 503 saying why, at once", status, retried, body, time.Since(start))
		}
	})

	t.Run("held until Envoy has a ready replica, then sent back to be retried there", func(t *testing.T) {
		start := time.Now()
		go func() {
			time.Sleep(300 * time.Millisecond)
			healthy.Store(1)
		}()
		status, retried, _ := held(t, backends, "model")
		if status != http.StatusServiceUnavailable || !retried {
			t.Fatalf("answer %d (retried %v); want 503 with %s", status, retried, wire.UnreachedHeader)
		}
		if took := time.Since(start); took < 250*time.Millisecond {
			t.Fatalf("released after %s, before the replica was ready", took)
		}
		healthy.Store(0)
	})
	t.Run("past hold_timeout_s, a 503 that says why and is not retried", func(t *testing.T) {
		status, retried, body := held(t, backends, "brief")
		if status != http.StatusServiceUnavailable || retried || !strings.Contains(body, "hold_timeout_s") {
			t.Fatalf("answer %d (retried %v) %q; want 503 naming hold_timeout_s", status, retried, body)
		}
	})
	t.Run("beyond max_held, a 503 at once", func(t *testing.T) {
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() { defer wg.Done(); held(t, backends, "small") }()
		}
		testutil.WaitFor(t, 5*time.Second, "two requests held for small", func() bool { return a.Held()["small"] == 2 })
		status, retried, body := held(t, backends, "small")
		if status != http.StatusServiceUnavailable || retried || !strings.Contains(body, "max_held") {
			t.Fatalf("third request: %d (retried %v) %q; want 503 naming max_held", status, retried, body)
		}
		healthy.Store(1) // release the two
		wg.Wait()
		healthy.Store(0)
		if n := a.Held()["small"]; n != 0 {
			t.Fatalf("%d still held after release", n)
		}
	})
	t.Run("an inbound request for a backend with no replica placed here goes back to its caller at once", func(t *testing.T) {
		start := time.Now()
		status, retried, _ := held(t, inbound, "elsewhere")
		if status != http.StatusServiceUnavailable || !retried || time.Since(start) > time.Second {
			t.Fatalf("answer %d (retried %v) after %s; want 503 with %s at once", status, retried, time.Since(start), wire.UnreachedHeader)
		}
		go func() {
			time.Sleep(200 * time.Millisecond)
			healthy.Store(1)
		}()
		if status, retried, _ := held(t, inbound, "here"); status != http.StatusServiceUnavailable || !retried || time.Since(start) < 150*time.Millisecond {
			t.Fatalf("inbound request for a backend placed here: %d (retried %v); want it held, then retried", status, retried)
		}
	})
	t.Run("a backend the desired state does not have", func(t *testing.T) {
		status, retried, body := held(t, backends, "nope")
		if status != http.StatusServiceUnavailable || retried || !strings.Contains(body, `"nope"`) {
			t.Fatalf("answer %d (retried %v) %q; want 503 naming the backend", status, retried, body)
		}
	})
}

// TestActivatorWithoutDesiredState: a node's Envoy run without an agent
// (servemesh envoy, for servemesh serve) holds any named backend's
// requests within the default bounds.
func TestActivatorWithoutDesiredState(t *testing.T) {
	var healthy atomic.Int64
	a := New(Options{Admin: membershipAdmin(t, &healthy), Node: "n1",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	a.poll = 10 * time.Millisecond
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = a.Serve(ctx, dir) }()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", filepath.Join(dir, wire.ActivatorSocket))
	}}}
	testutil.WaitFor(t, 5*time.Second, "the activator's socket", func() bool {
		_, err := os.Stat(filepath.Join(dir, wire.ActivatorSocket))
		return err == nil
	})
	go func() {
		time.Sleep(100 * time.Millisecond)
		healthy.Store(1)
	}()
	if status, retried, body := held(t, c, "static"); status != http.StatusServiceUnavailable || !retried {
		t.Fatalf("a request for a backend with no replica ready yet: %d (retried %v) %q; want held, then retried", status, retried, body)
	}
}
